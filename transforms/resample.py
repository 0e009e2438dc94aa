"""Resizing uint8 images in the CPU graph: PIL's separable triangle filter as a Numba kernel inside DALI.

Torchvision resizes PIL images with ``Image.resize(..., BILINEAR)``: a separable triangle filter whose support
widens with the downscale factor (antialiasing), applied along one axis, then the other (in Pillow's order, see
:func:`resample`), in 22-bit fixed point with a uint8 image between the two passes. This module computes the same
thing and equals PIL's output exactly (``tests/transforms/test_resample.py``). It exists for speed: on the
crops of an ImageNet-like training graph it runs 1.8x DALI's CPU ``fn.resize`` (``stallfree bench resize``; the
figures are in README.md), and resizing is the largest cost of a CPU training graph after decoding. On the GPU,
and for float images (a resize placed after ``Normalize``), the graph uses DALI's ``fn.resize``.

Each sample's output size comes in as the shape of an empty array (``spec.size_input``): DALI's set-up function
sizes a Numba operator's output from input shapes alone, and so one compiled operator (a few seconds of Numba
compilation, once per process) serves every size, fixed or per sample.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from nvidia.dali.pipeline import do_not_convert

from stallfree.transforms.numba_dali import numba_operator

__all__ = ["resample", "resize_node"]

_BITS = 22  # PIL's PRECISION_BITS: 32 - 8 - 2
_HALF = 1 << (_BITS - 1)


@numba.njit(cache=True)
def _coefficients(in_size: int, out_size: int, antialias: bool) -> tuple[np.ndarray, np.ndarray]:
    """For each output index: the first input index and tap count, and the fixed-point weights (PIL's precompute)."""
    scale = in_size / out_size
    filter_scale = max(scale, 1.0) if antialias else 1.0
    inverse = 1.0 / filter_scale  # PIL multiplies by the inverse (dividing can round t the other way)
    support = filter_scale  # the triangle filter's support is 1, widened by the filter scale
    taps = int(math.ceil(support)) * 2 + 1
    bounds = np.empty((out_size, 2), np.int32)
    weights = np.zeros((out_size, taps), np.int32)
    raw = np.empty(taps)
    for i in range(out_size):
        center = (i + 0.5) * scale
        first = max(int(center - support + 0.5), 0)
        count = min(int(center + support + 0.5), in_size) - first
        total = 0.0
        for k in range(count):
            t = abs((k + first - center + 0.5) * inverse)
            raw[k] = 1.0 - t if t < 1.0 else 0.0
            total += raw[k]
        for k in range(count):
            w = raw[k] / total if total != 0.0 else 0.0
            weights[i, k] = int(w * (1 << _BITS) + (0.5 if w >= 0 else -0.5))
        bounds[i, 0], bounds[i, 1] = first, count
    return bounds, weights


@numba.njit(inline="always")
def _to_uint8(acc: int) -> int:
    v = acc >> _BITS
    return 0 if v < 0 else (255 if v > 255 else v)


@numba.njit(cache=True)
def _horizontal(dst: np.ndarray, src: np.ndarray, row0: int, xb: np.ndarray, xw: np.ndarray) -> None:
    """Filter rows ``row0 .. row0 + len(dst)`` of ``src`` (any strides) along x into ``dst``."""
    channels = src.shape[2]
    for y in range(dst.shape[0]):
        line = src[row0 + y]
        for x in range(dst.shape[1]):
            first, count = xb[x, 0], xb[x, 1]
            if channels == 3:
                a0 = a1 = a2 = _HALF
                for k in range(count):
                    w = xw[x, k]
                    a0 += np.int32(line[first + k, 0]) * w
                    a1 += np.int32(line[first + k, 1]) * w
                    a2 += np.int32(line[first + k, 2]) * w
                dst[y, x, 0] = _to_uint8(a0)
                dst[y, x, 1] = _to_uint8(a1)
                dst[y, x, 2] = _to_uint8(a2)
            else:
                for c in range(channels):
                    acc = _HALF
                    for k in range(count):
                        acc += np.int32(line[first + k, c]) * xw[x, k]
                    dst[y, x, c] = _to_uint8(acc)


@numba.njit(cache=True)
def _vertical(dst: np.ndarray, src: np.ndarray, row0: int, yb: np.ndarray, yw: np.ndarray) -> None:
    """Filter the C-contiguous ``src`` (its row ``r`` is input row ``row0 + r``) along y into C-contiguous ``dst``."""
    rows, width, channels = src.shape
    line = width * channels
    # A whole row at a time, so that the inner loop runs over contiguous memory and vectorises.
    flat_src = src.reshape(rows, line)
    flat_dst = dst.reshape(dst.shape[0], line)
    acc = np.empty(line, np.int32)
    for y in range(dst.shape[0]):
        first, count = yb[y, 0] - row0, yb[y, 1]
        acc[:] = _HALF
        for k in range(count):
            w = yw[y, k]
            src_line = flat_src[first + k]
            for i in range(line):
                acc[i] += np.int32(src_line[i]) * w
        for i in range(line):
            flat_dst[y, i] = _to_uint8(acc[i])


@numba.njit(cache=True)
def resample(out: np.ndarray, image: np.ndarray, antialias: bool) -> None:
    """Resize the HWC uint8 ``image`` (any strides) into the C-contiguous HWC uint8 ``out``, as PIL's BILINEAR.

    Both passes round to uint8, so their order shows in the result (by a level, at some pixels): the order is
    Pillow 13's (``ImagingResampleInner``): columns first where the height shrinks by more than twice what the
    width does, rows first otherwise. A pass that keeps its axis's size is skipped, as Pillow skips it (its
    filter is the identity there, so this changes the time only).
    """
    height, width, channels = image.shape
    out_h, out_w = out.shape[0], out.shape[1]
    need_x, need_y = out_w != width, out_h != height
    if not need_x and not need_y:
        out[:, :, :] = image
        return
    xb, xw = _coefficients(width, out_w, antialias)
    yb, yw = _coefficients(height, out_h, antialias)
    if height - out_h > 0 and height - out_h > 2 * (width - out_w):
        source = image.copy()  # C-contiguous for the column pass (the image may be a window of a larger one)
        if not need_x:
            _vertical(out, source, 0, yb, yw)
            return
        columns = np.empty((out_h, width, channels), np.uint8)
        _vertical(columns, source, 0, yb, yw)
        _horizontal(out, columns, 0, xb, xw)
        return
    if not need_y:
        _horizontal(out, image, 0, xb, xw)
        return
    # Rows first, and only the rows the column pass reads.
    row_lo = yb[0, 0]
    row_hi = yb[out_h - 1, 0] + yb[out_h - 1, 1]
    rows = np.empty((row_hi - row_lo, out_w, channels), np.uint8)
    _horizontal(rows, image, row_lo, xb, xw)
    _vertical(out, rows, row_lo, yb, yw)


def _setup(outs: Any, ins: Any) -> None:
    # Input 0 is the size carrier (spec.size_input): an empty (height, width, 0) array. DALI's set-up sees input
    # shapes only, and graph images are RGB (decoded as RGB, or raw RGB shards), so the output is (h, w, 3).
    for i in range(len(outs[0])):
        outs[0][i][0], outs[0][i][1], outs[0][i][2] = ins[0][i][0], ins[0][i][1], 3


@functools.cache  # one function per configuration, so that numba_operator reuses its compiled operator
@do_not_convert
def _run(antialias: bool, windowed: bool) -> Callable[..., None]:
    if windowed:

        def run_window(out: np.ndarray, _size: np.ndarray, image: np.ndarray, window: np.ndarray) -> None:
            top, left = int(window[0]), int(window[1])
            resample(out, image[top : top + int(window[2]), left : left + int(window[3])], antialias)

        return run_window

    def run(out: np.ndarray, _size: np.ndarray, image: np.ndarray) -> None:
        resample(out, image, antialias)

    return run


def resize_node(image: Any, size: Any, *, antialias: bool = True, window: Any = None) -> Any:
    """A CPU DALI node resizing each RGB uint8 sample as PIL's BILINEAR (torchvision's resize of a PIL image).

    Args:
        image: the HWC RGB uint8 node.
        size: the per-sample output size, a node of :func:`stallfree.transforms.spec.size_input` arrays.
        antialias: widen the filter when downscaling (PIL always does; torchvision's default).
        window: an optional node of per-sample ``(top, left, height, width)`` float32: crop it first, then resize.
    """
    from stallfree.transforms.numba_abi import RESIZE_ENTRIES  # loads the cached entry points (compiles once)

    inputs = [size, image] if window is None else [size, image, window]
    operator = numba_operator(
        _run(antialias, window is not None),
        _setup,
        in_types=[np.uint8, np.uint8, np.float32][: len(inputs)],
        ins_ndim=[3, 3, 1][: len(inputs)],
        out_type=np.uint8,
        entries=RESIZE_ENTRIES[(window is not None, antialias)],
    )
    return operator(*inputs)
