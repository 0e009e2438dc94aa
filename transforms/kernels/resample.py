"""PIL's separable filters (``Image.resize(..., BILINEAR)`` and the others) as Numba kernels: the resampler's sums.

Applied along one axis, then the other (in Pillow's order, see :func:`_resample`), in 22-bit fixed point with a
uint8 image between the two passes, it equals PIL's output exactly (``tests/transforms/kernels/test_resample.py``).
The taps and their weights are :mod:`.filters`'; :mod:`.resample_node` runs these kernels inside DALI's graph, and
:mod:`.entries` builds their cached entry points from them; this module imports neither, so the three form no cycle.
Its functions are cached on disk and compile the filters in, so the cache is checked against :mod:`.filters` when
this module is imported (:func:`~stallfree.transforms.numba.disk_cache.check_cache`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from stallfree.transforms.kernels import filters
from stallfree.transforms.kernels.filters import (
    BITS,
    columns_first,
    filter_support,
    fixed_weight,
    span,
    span_total,
    tap_weight,
)
from stallfree.transforms.numba.disk_cache import check_cache

__all__ = ["resample", "resample_float", "resample_normalize", "resample_normalize_chw", "resample_normalize_hwc"]

_BITS = BITS
_HALF = 1 << (_BITS - 1)
# A first row index of 0 given as int64, not as the literal 0, which Numba would compile _pack and _filter for a
# second time (a literal is a type of its own): a second of a new installation's first batch.
_ZERO = np.int64(0)


def _check_cache() -> None:
    check_cache(_check_cache, (filters,))


_check_cache()  # before the functions below load (or compile) their code


@numba.njit(cache=True)
def _coefficients(in_size: int, out_size: int, antialias: bool, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """For each output index: the first input index and tap count, and the fixed-point weights (PIL's precompute)."""
    filter_scale = max(in_size / out_size, 1.0) if antialias else 1.0
    taps = int(math.ceil(filter_support(kind) * filter_scale)) * 2 + 1  # the most any output index can have
    bounds = np.empty((out_size, 2), np.int32)
    weights = np.zeros((out_size, taps), np.int32)
    for i in range(out_size):
        first, count, center, inverse = span(i, in_size, out_size, antialias, kind)
        total = span_total(first, count, center, inverse, kind)
        for k in range(count):
            weights[i, k] = fixed_weight(k, first, center, inverse, kind, total)
        bounds[i, 0], bounds[i, 1] = first, count
    return bounds, weights


@numba.njit(inline="always")
def _to_uint8(acc: int) -> int:
    v = acc >> _BITS
    return 0 if v < 0 else (255 if v > 255 else v)


# Pixels between the passes are packed, one uint32 each (channel c in byte c, the rest zero), so that a pass along
# either axis runs as the one fast loop, :func:`_filter`: along axis 0 over contiguous lines of bytes, which
# vectorises. Filtering along x directly gathers a few bytes per output pixel and was 85% of the resize; here the
# row pass transposes its input, filters along axis 0, and transposes back, and a transpose moves whole uint32s.
# Every byte lane is filtered on its own with the same fixed-point sums, so the result is unchanged to the bit.


@numba.njit(cache=True)
def _filter(dst: np.ndarray, src: np.ndarray, row0: int, bounds: np.ndarray, weights: np.ndarray) -> None:
    """Filter the C-contiguous 2-D uint8 ``src`` (line ``r`` is input index ``row0 + r``) along axis 0 into ``dst``."""
    line = src.shape[1]
    acc = np.empty(line, np.int32)
    for i in range(dst.shape[0]):
        first, count = bounds[i, 0] - row0, bounds[i, 1]
        acc[:] = _HALF
        for k in range(count):
            w = weights[i, k]
            src_line = src[first + k]
            for j in range(line):
                acc[j] += np.int32(src_line[j]) * w
        out = dst[i]
        for j in range(line):
            out[j] = _to_uint8(acc[j])


@numba.njit(cache=True)
def _filter_packed(dst: np.ndarray, src: np.ndarray, row0: int, bounds: np.ndarray, weights: np.ndarray) -> None:
    """:func:`_filter` over packed pixels: ``(n, m)`` uint32 arrays seen as ``(n, 4 m)`` bytes."""
    _filter(dst.view(np.uint8), src.view(np.uint8), row0, bounds, weights)


@numba.njit(cache=True)
def _pack(dst: np.ndarray, image: np.ndarray, row0: int) -> None:
    """Rows ``row0 .. row0 + len(dst)`` of the HWC ``image`` (any strides, 1-4 channels) as packed pixels in ``dst``."""
    channels = image.shape[2]
    for r in range(dst.shape[0]):
        line, out = image[row0 + r], dst[r]
        if channels == 3:  # the graph's case, written out so that it compiles to a few shifts a pixel
            for x in range(out.shape[0]):
                out[x] = np.uint32(line[x, 0]) | (np.uint32(line[x, 1]) << 8) | (np.uint32(line[x, 2]) << 16)
        else:
            for x in range(out.shape[0]):
                v = np.uint32(0)
                for c in range(channels):
                    v |= np.uint32(line[x, c]) << (8 * c)
                out[x] = v


@numba.njit(cache=True)
def _transpose(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst = src.T`` for 2-D uint32 arrays, in 8 x 8 blocks (a fixed block size lets the loops unroll)."""
    n, m = src.shape
    n8, m8 = n - n % 8, m - m % 8
    for i0 in range(0, n8, 8):
        for j0 in range(0, m8, 8):
            for i in range(8):
                for j in range(8):
                    dst[j0 + j, i0 + i] = src[i0 + i, j0 + j]
    for i in range(n):  # the edges the blocks leave
        for j in range(m8 if i < n8 else 0, m):
            dst[j, i] = src[i, j]


@numba.njit(cache=True)
def _row_pass(packed: np.ndarray, xb: np.ndarray, xw: np.ndarray) -> np.ndarray:
    """Filter the packed ``(rows, width)`` image along x: transposed, filtered along axis 0, transposed back."""
    rows, width = packed.shape
    transposed = np.empty((width, rows), np.uint32)
    _transpose(transposed, packed)
    filtered = np.empty((xb.shape[0], rows), np.uint32)
    _filter_packed(filtered, transposed, _ZERO, xb, xw)
    out = np.empty((rows, xb.shape[0]), np.uint32)
    _transpose(out, filtered)
    return out


@numba.njit(cache=True)
def _resample(out_h: int, out_w: int, image: np.ndarray, antialias: bool, mirror: bool,
              kind: int = 0) -> tuple[np.ndarray, bool]:
    """The HWC uint8 ``image`` (any strides, 1-4 channels) resized by PIL's filter, as packed ``(out_h, out_w)``.

    The filter is ``kind`` (:data:`~.filters.FILTERS`): BILINEAR's triangle unless told otherwise.

    Mirrored left to right if ``mirror`` where a row pass runs; returns whether it mirrored. Each output column of
    the row pass is its own weighted sum, so taking the columns' coefficients in reverse order writes exactly the
    mirror of the unmirrored result, at no cost.

    Both passes round to uint8, so their order shows in the result (by a level, at some pixels): the order is
    Pillow 13's (``ImagingResampleInner``): columns first where the height shrinks by more than twice what the
    width does, rows first otherwise. A pass that keeps its axis's size is skipped, as Pillow skips it (its
    filter is the identity there, so this changes the time only).
    """
    height, width = image.shape[0], image.shape[1]
    need_x, need_y = out_w != width, out_h != height
    if not need_x and not need_y:
        same = np.empty((height, width), np.uint32)
        _pack(same, image, _ZERO)
        return same, False
    xb, xw = _coefficients(width, out_w, antialias, kind)
    if mirror:
        xb, xw = xb[::-1].copy(), xw[::-1].copy()
    yb, yw = _coefficients(height, out_h, antialias, kind)
    if columns_first(height, width, out_h, out_w):
        source = np.empty((height, width), np.uint32)
        _pack(source, image, _ZERO)
        columns = np.empty((out_h, width), np.uint32)
        _filter_packed(columns, source, _ZERO, yb, yw)
        if not need_x:
            return columns, False
        return _row_pass(columns, xb, xw), mirror
    # Rows first, and only the rows the column pass reads.
    row_lo, row_hi = 0, height
    if need_y:
        row_lo, row_hi = yb[0, 0], yb[out_h - 1, 0] + yb[out_h - 1, 1]
    packed = np.empty((row_hi - row_lo, width), np.uint32)
    _pack(packed, image, row_lo)
    rows = _row_pass(packed, xb, xw)
    if not need_y:
        return rows, mirror
    both = np.empty((out_h, out_w), np.uint32)
    _filter_packed(both, rows, row_lo, yb, yw)
    return both, mirror


@numba.njit(cache=True)
def resample(out: np.ndarray, image: np.ndarray, antialias: bool) -> None:
    """Resize the HWC uint8 ``image`` (any strides, 1-4 channels) into HWC uint8 ``out``, as PIL's BILINEAR."""
    if image.shape[2] > 4 or image.shape[2] != out.shape[2]:
        raise ValueError("resample: image and out need the same channel count, at most 4")
    packed, _ = _resample(out.shape[0], out.shape[1], image, antialias, False)
    flat = packed.view(np.uint8)
    for y in range(out.shape[0]):
        for x in range(out.shape[1]):
            for c in range(out.shape[2]):
                out[y, x, c] = flat[y, 4 * x + c]


@numba.njit(cache=True)
def resample_normalize(out: np.ndarray, image: np.ndarray, flags: np.ndarray, mirror: bool) -> None:
    """Resize the HWC RGB uint8 ``image`` as :func:`resample`, then write ``(pixel - mean) / std`` to float32 ``out``.

    ``flags`` is float32 ``[mean0, mean1, mean2, inv0, inv1, inv2, antialias, chw]`` (``inv = 1 / std``, both on
    the 0..255 scale), and a ninth, the filter's code in :data:`~.filters.FILTERS` (BILINEAR where absent): ``out`` is
    ``(3, h, w)`` if ``chw`` else ``(h, w, 3)``, mirrored left to right if ``mirror``. The pixels between the two
    are the resampler's uint8, so the result is what the resampler followed by DALI's ``crop_mirror_normalize``
    gives (to float32 rounding), written in one contiguous pass instead of by a second operator reading the uint8
    batch again.
    """
    if flags[7] != 0:
        resample_normalize_chw(out, image, flags, mirror)
    else:
        resample_normalize_hwc(out, image, flags, mirror)


# One function per layout, so that a graph's entry point compiles the one it writes (entries.py).


@numba.njit(cache=True)
def resample_normalize_chw(out: np.ndarray, image: np.ndarray, flags: np.ndarray, mirror: bool) -> None:
    """:func:`resample_normalize` into a ``(3, h, w)`` ``out`` (``flags[7]`` is not read)."""
    kind = int(flags[8]) if flags.shape[0] > 8 else 0
    packed, mirrored = _resample(out.shape[1], out.shape[2], image, flags[6] != 0, mirror, kind)  # the row pass mirrors
    _emit_chw(out, packed.view(np.uint8), flags, mirror and not mirrored)


@numba.njit(cache=True)
def resample_normalize_hwc(out: np.ndarray, image: np.ndarray, flags: np.ndarray, mirror: bool) -> None:
    """:func:`resample_normalize` into a ``(h, w, 3)`` ``out`` (``flags[7]`` is not read)."""
    kind = int(flags[8]) if flags.shape[0] > 8 else 0
    packed, mirrored = _resample(out.shape[0], out.shape[1], image, flags[6] != 0, mirror, kind)
    _emit_hwc(out, packed.view(np.uint8), flags, mirror and not mirrored)


@numba.njit(cache=True)
def _emit_chw(out: np.ndarray, pixels: np.ndarray, flags: np.ndarray, reverse: bool) -> None:
    # Each channel's plane row by row from the packed row (4 bytes a pixel); reversed only where no row pass ran
    # to mirror the pixels (a crop kept at its width).
    height, width = out.shape[1], out.shape[2]
    m0, m1, m2, i0, i1, i2 = flags[0], flags[1], flags[2], flags[3], flags[4], flags[5]
    for y in range(height):
        line, d0, d1, d2 = pixels[y], out[0, y], out[1, y], out[2, y]
        for x in range(width):
            s = 4 * (width - 1 - x) if reverse else 4 * x
            d0[x] = (np.float32(line[s]) - m0) * i0
            d1[x] = (np.float32(line[s + 1]) - m1) * i1
            d2[x] = (np.float32(line[s + 2]) - m2) * i2


@numba.njit(cache=True)
def _emit_hwc(out: np.ndarray, pixels: np.ndarray, flags: np.ndarray, reverse: bool) -> None:
    height, width = out.shape[0], out.shape[1]
    m0, m1, m2, i0, i1, i2 = flags[0], flags[1], flags[2], flags[3], flags[4], flags[5]
    dst = out.reshape(height, width * 3)
    for y in range(height):
        line, row = pixels[y], dst[y]
        for x in range(width):
            d = 3 * x
            s = 4 * (width - 1 - x) if reverse else 4 * x
            row[d] = (np.float32(line[s]) - m0) * i0
            row[d + 1] = (np.float32(line[s + 1]) - m1) * i1
            row[d + 2] = (np.float32(line[s + 2]) - m2) * i2


# Float images (a resize after Normalize): the same filters and passes with float weights, as torch's antialiased
# interpolate (which follows PIL's algorithm) computes them. Each weight is rounded to float32 and each pixel is
# float32, so every product is exact in float64 (24 + 24 bits): the float64 sums are then the same whether or not a
# GPU fuses the multiply and the add, and :mod:`.resample_cuda` gives these pixels to the bit.


@numba.njit(cache=True)
def _float_coefficients(in_size: int, out_size: int, antialias: bool, kind: int) -> tuple[np.ndarray, np.ndarray]:
    """As :func:`_coefficients`, with each weight rounded to float32."""
    filter_scale = max(in_size / out_size, 1.0) if antialias else 1.0
    taps = int(math.ceil(filter_support(kind) * filter_scale)) * 2 + 1
    bounds = np.empty((out_size, 2), np.int64)
    weights = np.zeros((out_size, taps), np.float32)
    for i in range(out_size):
        first, count, center, inverse = span(i, in_size, out_size, antialias, kind)
        total = span_total(first, count, center, inverse, kind)
        for k in range(count):
            weights[i, k] = np.float32(tap_weight(k, first, center, inverse, kind, total))
        bounds[i, 0], bounds[i, 1] = first, count
    return bounds, weights


@numba.njit(cache=True)
def _float_rows(dst: np.ndarray, src: np.ndarray, bounds: np.ndarray, weights: np.ndarray) -> None:
    """``src`` (HWC float32) filtered along x into ``dst``."""
    for y in range(dst.shape[0]):
        for x in range(dst.shape[1]):
            first, count = bounds[x, 0], bounds[x, 1]
            for c in range(dst.shape[2]):
                acc = 0.0
                for k in range(count):
                    acc += np.float64(src[y, first + k, c]) * np.float64(weights[x, k])
                dst[y, x, c] = np.float32(acc)


@numba.njit(cache=True)
def _float_columns(dst: np.ndarray, src: np.ndarray, bounds: np.ndarray, weights: np.ndarray) -> None:
    """``src`` (HWC float32) filtered along y into ``dst``."""
    for y in range(dst.shape[0]):
        first, count = bounds[y, 0], bounds[y, 1]
        for x in range(dst.shape[1]):
            for c in range(dst.shape[2]):
                acc = 0.0
                for k in range(count):
                    acc += np.float64(src[first + k, x, c]) * np.float64(weights[y, k])
                dst[y, x, c] = np.float32(acc)


@numba.njit(cache=True)
def resample_float(out: np.ndarray, image: np.ndarray, antialias: bool, kind: int) -> None:
    """Resize the HWC float32 ``image`` (any strides) into HWC float32 ``out`` by PIL's filter ``kind``, in float.

    The passes' order is :func:`columns_first`'s, a pass that keeps its axis's size is skipped, and the image
    between the two passes is float32 (as torch's). No clamping: a float image has no range.
    """
    height, width = image.shape[0], image.shape[1]
    out_h, out_w = out.shape[0], out.shape[1]
    if image.shape[2] != out.shape[2]:
        raise ValueError("resample_float: image and out need the same channel count")
    need_x, need_y = out_w != width, out_h != height
    if not need_x and not need_y:
        out[:] = image
    elif columns_first(height, width, out_h, out_w):
        yb, yw = _float_coefficients(height, out_h, antialias, kind)
        if not need_x:
            _float_columns(out, image, yb, yw)
            return
        xb, xw = _float_coefficients(width, out_w, antialias, kind)
        middle = np.empty((out_h, width, image.shape[2]), np.float32)
        _float_columns(middle, image, yb, yw)
        _float_rows(out, middle, xb, xw)
    else:
        xb, xw = _float_coefficients(width, out_w, antialias, kind)
        if not need_y:
            _float_rows(out, image, xb, xw)
            return
        yb, yw = _float_coefficients(height, out_h, antialias, kind)
        middle = np.empty((height, out_w, image.shape[2]), np.float32)
        _float_rows(middle, image, xb, xw)
        _float_columns(out, middle, yb, yw)
