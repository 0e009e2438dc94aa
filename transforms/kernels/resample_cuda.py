"""The resampler on the GPU: PIL's filters as ``numba.cuda`` kernels run in DALI's GPU graph, to the CPU's pixels.

DALI's ``fn.resize`` is another filter than PIL's (up to 22 levels apart where an axis shrinks), so a spec moved from
``device="cpu"`` to ``"cuda"`` would train on other pixels. These kernels compute what :mod:`.resample`
computes on the CPU, from the same functions: the taps' spans and weights (:func:`~.filters.span`,
:func:`~.filters.fixed_weight`, compiled for both targets), Pillow's order of the two passes, the uint8
rounding between them, and the mirror. DALI launches a kernel once per sample on a grid-stride grid; each thread
computes its output pixels whole. A GPU kernel cannot allocate the image between the two passes, so each output
pixel recomputes the first pass's values it reads (``taps`` of them, each a ``taps``-long sum): more arithmetic
than the CPU's two passes, none of it shared between threads, and no memory but the image and the output.

Equal to the CPU to the bit: ``tests/transforms/kernels/test_resample_cudasim.py`` (the simulator, 512 random shapes per
variant) and, on a GPU, ``tests/transforms/kernels/test_resample_gpu.py`` through DALI (``bench/gpu_check.sh``). Where
the hardware could differ from the simulator, it cannot change a result: the uint8 sums are integers, the float sums add
float32 x float32 products, exact in float64 with or without a fused multiply-add; only the float64 weights before their
rounding (to 22-bit fixed point, or to float32) pass through the GPU's own ``sin``/``cos`` (HAMMING, LANCZOS) and
contraction, a last-bit difference that changes a rounded weight only at an exact tie.

Kernels (DALI's GPU ``numba_function`` run functions, ``batch_processing=False``; input 0 is the size carrier):

    resize_u8(out, size, image, flags)                          flags: float32 [antialias, kind]
    resize_u8_window(out, size, image, window, flags)           window: float32 (top, left, height, width)
    resize_f32(out, size, image, flags)                         float32 images (after Normalize)
    resize_f32_window(out, size, image, window, flags)
    resize_normalize(out, size, image, mirror, flags)           flags as resample.resample_normalize's
    resize_normalize_window(out, size, image, window, mirror, flags)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda

from stallfree.transforms.kernels.filters import (
    BITS,
    columns_first,
    fixed_weight,
    span,
    span_total,
    tap_weight,
)

__all__ = ["KERNELS", "level", "value_f32"]

_HALF = 1 << (BITS - 1)
_cuda: Any = cuda  # numba.cuda's intrinsics, typed by Numba, not by their Python stubs


@cuda.jit(device=True)
def _clip(acc: Any) -> Any:
    v = acc >> BITS
    return 0 if v < 0 else (255 if v > 255 else v)


@cuda.jit(device=True)
def _row_level(image: Any, y: Any, xs: Any, out_w: Any, antialias: Any, kind: Any, c: Any) -> Any:
    # The row pass's uint8 value at input row y, output column xs.
    first, count, center, inverse = span(xs, image.shape[1], out_w, antialias, kind)
    total = span_total(first, count, center, inverse, kind)
    acc = _HALF
    for k in range(count):
        acc += int(image[y, first + k, c]) * fixed_weight(k, first, center, inverse, kind, total)
    return _clip(acc)


@cuda.jit(device=True)
def _column_level(image: Any, ys: Any, x: Any, out_h: Any, antialias: Any, kind: Any, c: Any) -> Any:
    # The column pass's uint8 value at output row ys, input column x.
    first, count, center, inverse = span(ys, image.shape[0], out_h, antialias, kind)
    total = span_total(first, count, center, inverse, kind)
    acc = _HALF
    for k in range(count):
        acc += int(image[first + k, x, c]) * fixed_weight(k, first, center, inverse, kind, total)
    return _clip(acc)


@cuda.jit(device=True)
def level(image: Any, y: Any, xs: Any, c: Any, out_h: Any, out_w: Any, antialias: Any, kind: Any) -> Any:
    """Channel ``c`` of output pixel ``(y, xs)`` of the uint8 ``image`` resized to ``(out_h, out_w)``: an int.

    :func:`~.resample._resample`'s result at that pixel: the same passes in the same order, each rounded
    to uint8, and a pass that keeps its axis's size skipped (its weights are the identity there).
    """
    height, width = image.shape[0], image.shape[1]
    need_x, need_y = out_w != width, out_h != height
    if not need_x and not need_y:
        return int(image[y, xs, c])
    if columns_first(height, width, out_h, out_w):
        if not need_x:
            return _column_level(image, y, xs, out_h, antialias, kind, c)
        first, count, center, inverse = span(xs, width, out_w, antialias, kind)
        total = span_total(first, count, center, inverse, kind)
        acc = _HALF
        for k in range(count):
            v = _column_level(image, y, first + k, out_h, antialias, kind, c)
            acc += v * fixed_weight(k, first, center, inverse, kind, total)
        return _clip(acc)
    if not need_y:
        return _row_level(image, y, xs, out_w, antialias, kind, c)
    first, count, center, inverse = span(y, height, out_h, antialias, kind)
    total = span_total(first, count, center, inverse, kind)
    acc = _HALF
    for k in range(count):
        v = _row_level(image, first + k, xs, out_w, antialias, kind, c)
        acc += v * fixed_weight(k, first, center, inverse, kind, total)
    return _clip(acc)


@cuda.jit(device=True)
def _row_f32(image: Any, y: Any, xs: Any, out_w: Any, antialias: Any, kind: Any, c: Any) -> Any:
    first, count, center, inverse = span(xs, image.shape[1], out_w, antialias, kind)
    total = span_total(first, count, center, inverse, kind)
    acc = 0.0
    for k in range(count):
        w = np.float32(tap_weight(k, first, center, inverse, kind, total))
        acc += np.float64(image[y, first + k, c]) * np.float64(w)
    return np.float32(acc)


@cuda.jit(device=True)
def _column_f32(image: Any, ys: Any, x: Any, out_h: Any, antialias: Any, kind: Any, c: Any) -> Any:
    first, count, center, inverse = span(ys, image.shape[0], out_h, antialias, kind)
    total = span_total(first, count, center, inverse, kind)
    acc = 0.0
    for k in range(count):
        w = np.float32(tap_weight(k, first, center, inverse, kind, total))
        acc += np.float64(image[first + k, x, c]) * np.float64(w)
    return np.float32(acc)


@cuda.jit(device=True)
def value_f32(image: Any, y: Any, xs: Any, c: Any, out_h: Any, out_w: Any, antialias: Any, kind: Any) -> Any:
    """Channel ``c`` of output pixel ``(y, xs)`` of the float32 ``image`` resized: :func:`~.resample.resample_float`."""
    height, width = image.shape[0], image.shape[1]
    need_x, need_y = out_w != width, out_h != height
    if not need_x and not need_y:
        return image[y, xs, c]
    if columns_first(height, width, out_h, out_w):
        if not need_x:
            return _column_f32(image, y, xs, out_h, antialias, kind, c)
        first, count, center, inverse = span(xs, width, out_w, antialias, kind)
        total = span_total(first, count, center, inverse, kind)
        acc = 0.0
        for k in range(count):
            w = np.float32(tap_weight(k, first, center, inverse, kind, total))
            acc += np.float64(_column_f32(image, y, first + k, out_h, antialias, kind, c)) * np.float64(w)
        return np.float32(acc)
    if not need_y:
        return _row_f32(image, y, xs, out_w, antialias, kind, c)
    first, count, center, inverse = span(y, height, out_h, antialias, kind)
    total = span_total(first, count, center, inverse, kind)
    acc = 0.0
    for k in range(count):
        w = np.float32(tap_weight(k, first, center, inverse, kind, total))
        acc += np.float64(_row_f32(image, first + k, xs, out_w, antialias, kind, c)) * np.float64(w)
    return np.float32(acc)


# Each thread walks its pixels of the grid-stride grid and writes every channel. The bodies are device functions,
# so that a windowed run function passes them a view of its crop; the run functions themselves are plain functions,
# which DALI compiles with numba.cuda.jit.


@cuda.jit(device=True)
def _resize_u8(out: Any, image: Any, flags: Any) -> None:
    x0, y0 = _cuda.grid(2)
    sx, sy = _cuda.gridsize(2)
    antialias, kind = flags[0] != 0, int(flags[1])
    out_h, out_w = out.shape[0], out.shape[1]
    for y in range(y0, out_h, sy):
        for x in range(x0, out_w, sx):
            for c in range(out.shape[2]):
                out[y, x, c] = level(image, y, x, c, out_h, out_w, antialias, kind)


@cuda.jit(device=True)
def _resize_f32(out: Any, image: Any, flags: Any) -> None:
    x0, y0 = _cuda.grid(2)
    sx, sy = _cuda.gridsize(2)
    antialias, kind = flags[0] != 0, int(flags[1])
    out_h, out_w = out.shape[0], out.shape[1]
    for y in range(y0, out_h, sy):
        for x in range(x0, out_w, sx):
            for c in range(out.shape[2]):
                out[y, x, c] = value_f32(image, y, x, c, out_h, out_w, antialias, kind)


@cuda.jit(device=True)
def _resize_normalize(out: Any, image: Any, mirror: Any, flags: Any) -> None:
    # resample.resample_normalize: (pixel - mean) * inverse std, (3, h, w) if flags[7] else (h, w, 3),
    # mirrored left to right (output column x is the unmirrored column out_w - 1 - x, as the CPU's reversed taps).
    x0, y0 = _cuda.grid(2)
    sx, sy = _cuda.gridsize(2)
    chw, antialias = flags[7] != 0, flags[6] != 0
    kind = int(flags[8]) if flags.shape[0] > 8 else 0
    out_h, out_w = (out.shape[1], out.shape[2]) if chw else (out.shape[0], out.shape[1])
    flip = mirror[0] != 0
    for y in range(y0, out_h, sy):
        for x in range(x0, out_w, sx):
            xs = out_w - 1 - x if flip else x
            for c in range(3):
                v = (np.float32(level(image, y, xs, c, out_h, out_w, antialias, kind)) - flags[c]) * flags[3 + c]
                if chw:
                    out[c, y, x] = v
                else:
                    out[y, x, c] = v


def resize_u8(out: Any, _size: Any, image: Any, flags: Any) -> None:
    _resize_u8(out, image, flags)


def resize_u8_window(out: Any, _size: Any, image: Any, window: Any, flags: Any) -> None:
    top, left = int(window[0]), int(window[1])
    _resize_u8(out, image[top : top + int(window[2]), left : left + int(window[3])], flags)


def resize_f32(out: Any, _size: Any, image: Any, flags: Any) -> None:
    _resize_f32(out, image, flags)


def resize_f32_window(out: Any, _size: Any, image: Any, window: Any, flags: Any) -> None:
    top, left = int(window[0]), int(window[1])
    _resize_f32(out, image[top : top + int(window[2]), left : left + int(window[3])], flags)


def resize_normalize(out: Any, _size: Any, image: Any, mirror: Any, flags: Any) -> None:
    _resize_normalize(out, image, mirror, flags)


def resize_normalize_window(out: Any, _size: Any, image: Any, window: Any, mirror: Any, flags: Any) -> None:
    top, left = int(window[0]), int(window[1])
    _resize_normalize(out, image[top : top + int(window[2]), left : left + int(window[3])], mirror, flags)


#: ``(variant, windowed) -> run function``, variant one of ``"uint8"``, ``"float32"``, ``"normalize"``.
KERNELS: dict[tuple[str, bool], Callable[..., None]] = {
    ("uint8", False): resize_u8,
    ("uint8", True): resize_u8_window,
    ("float32", False): resize_f32,
    ("float32", True): resize_f32_window,
    ("normalize", False): resize_normalize,
    ("normalize", True): resize_normalize_window,
}
