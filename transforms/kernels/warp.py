"""PIL's ``Image.transform`` (AFFINE and PERSPECTIVE; NEAREST, BILINEAR, BICUBIC) as a Numba kernel, and its DALI entry.

torchvision rotates, shears and warps PIL images with ``Image.rotate`` / ``Image.transform``: each output pixel's
centre ``(x + 0.5, y + 0.5)`` is mapped to the source by the coefficients ``a`` and sampled there, the pixels that
map outside keeping the fill colour. Pillow (``libImaging/Geometry.c``) picks one of four engines, and their
arithmetic differs in the last bits, so this kernel follows the same choice to give the same pixels:

    NEAREST, an axis-aligned scale (a1 = a3 = 0)     per axis, the source coordinate walked in double precision
    NEAREST, other affines inside 16.16's range      16.16 fixed point, walked along rows and columns
    NEAREST, the rest                                double precision, walked
    BILINEAR / BICUBIC, and every PERSPECTIVE        the generic engine: each pixel mapped on its own, filtered
                                                     with the border rows and columns repeated, truncated to uint8

Parameters come as one float64 vector per sample, ``[method, filter, a0 .. a7, 1, fill_r, fill_g, fill_b]`` (method
0: affine, 1: perspective; filter 0: nearest, 1: bilinear, 2: bicubic; ``a0 .. a7, 1`` the 3 x 3 matrix, row by row,
that DALI's ``warp_perspective`` takes on the GPU); the output size as the shape of an empty
``(h, w, 0)`` array (:func:`stallfree.transforms.spec.size_input`), so one compiled operator serves every size.
The entry points are ``cfunc``s cached on disk beside this file, whose stamp Numba checks (:func:`entries`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numba
import numpy as np
from numba import carray, cfunc
from nvidia.dali.plugin.numba import address_as_void_pointer as _ptr  # type: ignore[attr-defined]

from stallfree.transforms.numba.abi import RUN, SETUP, hwc_u8, vector_f64

__all__ = ["AFFINE", "BICUBIC", "BILINEAR", "NEAREST", "PERSPECTIVE", "entries", "warp"]

#: The parameter vector's codes: its method, then its filter.
AFFINE, PERSPECTIVE = 0, 1
NEAREST, BILINEAR, BICUBIC = 0, 1, 2


@numba.njit(inline="always")
def _coord(v: float) -> int:
    # PIL's COORD: -1 for any negative coordinate, else truncation.
    return -1 if v < 0.0 else int(v)


@numba.njit(inline="always")
def _floor(v: float) -> int:
    return int(math.floor(v))


@numba.njit(inline="always")
def _clip(v: int, size: int) -> int:
    return 0 if v < 0 else (v if v < size else size - 1)


@numba.njit(inline="always")
def _cubic(v1: float, v2: float, v3: float, v4: float, d: float) -> float:
    p1 = v2
    p2 = -v1 + v3
    p3 = 2 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return p1 + d * (p2 + d * (p3 + d * p4))


@numba.njit(inline="always")
def _bilinear(out: np.ndarray, oy: int, ox: int, image: np.ndarray, xin: float, yin: float) -> None:
    height, width = image.shape[0], image.shape[1]
    if xin < 0.0 or xin >= width or yin < 0.0 or yin >= height:
        return
    xin -= 0.5
    yin -= 0.5
    x, y = _floor(xin), _floor(yin)
    dx, dy = xin - x, yin - y
    x0, x1 = _clip(x, width), _clip(x + 1, width)
    row0 = _clip(y, height)
    for c in range(out.shape[2]):
        a, b = float(image[row0, x0, c]), float(image[row0, x1, c])
        v1 = a + (b - a) * dx
        v2 = v1
        if 0 <= y + 1 < height:
            a, b = float(image[y + 1, x0, c]), float(image[y + 1, x1, c])
            v2 = a + (b - a) * dx
        out[oy, ox, c] = np.uint8(int(v1 + (v2 - v1) * dy))


@numba.njit(inline="always")
def _bicubic(out: np.ndarray, oy: int, ox: int, image: np.ndarray, xin: float, yin: float) -> None:
    height, width = image.shape[0], image.shape[1]
    if xin < 0.0 or xin >= width or yin < 0.0 or yin >= height:
        return
    xin -= 0.5
    yin -= 0.5
    x, y = _floor(xin), _floor(yin)
    dx, dy = xin - x, yin - y
    x, y = x - 1, y - 1
    x0, x1, x2, x3 = _clip(x, width), _clip(x + 1, width), _clip(x + 2, width), _clip(x + 3, width)
    for c in range(out.shape[2]):
        r = _clip(y, height)
        v1 = _cubic(float(image[r, x0, c]), float(image[r, x1, c]), float(image[r, x2, c]), float(image[r, x3, c]), dx)
        v2 = v1
        if 0 <= y + 1 < height:
            r = y + 1
            v2 = _cubic(float(image[r, x0, c]), float(image[r, x1, c]), float(image[r, x2, c]),
                        float(image[r, x3, c]), dx)
        v3 = v2
        if 0 <= y + 2 < height:
            r = y + 2
            v3 = _cubic(float(image[r, x0, c]), float(image[r, x1, c]), float(image[r, x2, c]),
                        float(image[r, x3, c]), dx)
        v4 = v3
        if 0 <= y + 3 < height:
            r = y + 3
            v4 = _cubic(float(image[r, x0, c]), float(image[r, x1, c]), float(image[r, x2, c]),
                        float(image[r, x3, c]), dx)
        v = _cubic(v1, v2, v3, v4, dy)
        out[oy, ox, c] = 0 if v <= 0.0 else (255 if v >= 255.0 else np.uint8(int(v)))


@numba.njit(inline="always")
def _copy(out: np.ndarray, oy: int, ox: int, image: np.ndarray, y: int, x: int) -> None:
    for c in range(out.shape[2]):
        out[oy, ox, c] = image[y, x, c]


@numba.njit(cache=True)
def _generic(out: np.ndarray, image: np.ndarray, a: np.ndarray, method: int, kind: int) -> None:
    for y in range(out.shape[0]):
        for x in range(out.shape[1]):
            xi, yi = x + 0.5, y + 0.5
            if method == PERSPECTIVE:
                w = a[6] * xi + a[7] * yi + 1
                xx = (a[0] * xi + a[1] * yi + a[2]) / w
                yy = (a[3] * xi + a[4] * yi + a[5]) / w
            else:
                xx = a[0] * xi + a[1] * yi + a[2]
                yy = a[3] * xi + a[4] * yi + a[5]
            if kind == BILINEAR:
                _bilinear(out, y, x, image, xx, yy)
            elif kind == BICUBIC:
                _bicubic(out, y, x, image, xx, yy)
            else:
                cx, cy = _coord(xx), _coord(yy)
                if 0 <= cx < image.shape[1] and 0 <= cy < image.shape[0]:
                    _copy(out, y, x, image, cy, cx)


@numba.njit(cache=True)
def _scale(out: np.ndarray, image: np.ndarray, a: np.ndarray) -> None:
    height, width = image.shape[0], image.shape[1]
    xo = a[2] + a[0] * 0.5
    cols = np.full(out.shape[1], -1, np.int64)
    for x in range(out.shape[1]):
        xin = _coord(xo)
        if 0 <= xin < width:
            cols[x] = xin
        xo += a[0]
    yo = a[5] + a[4] * 0.5
    for y in range(out.shape[0]):
        yi = _coord(yo)
        if 0 <= yi < height:
            for x in range(out.shape[1]):
                if cols[x] >= 0:
                    _copy(out, y, x, image, yi, cols[x])
        yo += a[4]


@numba.njit(inline="always")
def _fits_fixed(a: np.ndarray, x: int, y: int) -> bool:
    return abs(x * a[0] + y * a[1] + a[2]) < 32768.0 and abs(x * a[3] + y * a[4] + a[5]) < 32768.0


@numba.njit(inline="always")
def _fix(v: float) -> int:
    return _floor(v * 65536.0 + 0.5)


@numba.njit(cache=True)
def _affine_nearest(out: np.ndarray, image: np.ndarray, a: np.ndarray) -> None:
    height, width = image.shape[0], image.shape[1]
    w, h = out.shape[1], out.shape[0]
    if _fits_fixed(a, 0, 0) and _fits_fixed(a, w, h) and _fits_fixed(a, 0, h) and _fits_fixed(a, w, 0):
        a0, a1, a3, a4 = _fix(a[0]), _fix(a[1]), _fix(a[3]), _fix(a[4])
        a2 = _fix(a[2] + a[0] * 0.5 + a[1] * 0.5)
        a5 = _fix(a[5] + a[3] * 0.5 + a[4] * 0.5)
        for y in range(h):
            xx, yy = a2, a5
            for x in range(w):
                xin = xx >> 16
                if 0 <= xin < width:
                    yin = yy >> 16
                    if 0 <= yin < height:
                        _copy(out, y, x, image, yin, xin)
                xx += a0
                yy += a3
            a2 += a1
            a5 += a4
        return
    xo = a[2] + a[1] * 0.5 + a[0] * 0.5
    yo = a[5] + a[4] * 0.5 + a[3] * 0.5
    for y in range(h):
        xf, yf = xo, yo
        for x in range(w):
            xin = _coord(xf)
            if 0 <= xin < width:
                yin = _coord(yf)
                if 0 <= yin < height:
                    _copy(out, y, x, image, yin, xin)
            xf += a[0]
            yf += a[3]
        xo += a[1]
        yo += a[4]


@numba.njit(cache=True)
def warp(out: np.ndarray, image: np.ndarray, params: np.ndarray) -> None:
    """``out`` (HWC uint8, its size the output's) as PIL's ``image.transform(size, method, a, filter, fill)``."""
    method, kind = int(params[0]), int(params[1])
    a = params[2:10]
    for c in range(out.shape[2]):  # the fill colour, where no source pixel lands (torchvision always passes one)
        fill = np.uint8(int(params[11 + c]))
        for y in range(out.shape[0]):
            for x in range(out.shape[1]):
                out[y, x, c] = fill
    if method == PERSPECTIVE or kind != NEAREST:
        _generic(out, image, a, method, kind)
    elif a[1] == 0 and a[3] == 0:
        _scale(out, image, a)
    else:
        _affine_nearest(out, image, a)


def _warp_run(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    # Inputs: the size carrier, the image, the float64 parameters.
    warp(hwc_u8(o, os_, on, no, 0), hwc_u8(i, is_, in_, ni, 1), vector_f64(i, is_, in_, ni, 2))


@numba.njit(cache=True)
def _shape(shapes_ptr: int, ndims_ptr: int, count: int, samples: int, which: int, sample: int) -> np.ndarray:
    ndims = carray(_ptr(ndims_ptr), count, dtype=np.int32)
    table = carray(_ptr(shapes_ptr), (count, samples), dtype=np.int64)
    return carray(_ptr(table[which][sample]), ndims[which], dtype=np.int64)


def _warp_setup(out_shapes: int, out_ndims: int, num_outs: int, in_shapes: int, in_ndims: int, num_ins: int,
                num_samples: int) -> None:
    # (h, w) from the size carrier (input 0), the image's channels (input 1).
    for s in range(num_samples):
        out = _shape(out_shapes, out_ndims, num_outs, num_samples, 0, s)
        size = _shape(in_shapes, in_ndims, num_ins, num_samples, 0, s)
        image = _shape(in_shapes, in_ndims, num_ins, num_samples, 1, s)
        out[0], out[1], out[2] = size[0], size[1], image[2]


@functools.cache
def entries() -> tuple[Any, Any]:
    """``(run cfunc, setup cfunc)`` of the warp operator, compiled (or loaded from Numba's cache) on first use.

    Made here rather than when the module loads, so that importing the spec (which reads the codes above) compiles
    nothing; the functions are module-level, so Numba caches them under their own names as it would decorated.
    """
    return cfunc(RUN, cache=True)(_warp_run), cfunc(SETUP, cache=True)(_warp_setup)
