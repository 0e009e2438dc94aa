"""PIL's resampling filters: each tap's span and weight, and the order of the two passes, for the CPU and the GPU.

The arithmetic of Pillow's ``Resample.c`` precompute, function for function: which input pixels an output pixel
reads (:func:`span`), each one's weight (:func:`tap_weight`, and :func:`fixed_weight` in PIL's 22-bit fixed point)
and which axis goes first (:func:`columns_first`). ``register_jitable`` compiles them into the CPU resampler
(:mod:`.resample`) and the GPU one (:mod:`.resample_cuda`) alike, so that the two compute the same taps. The CPU
resampler's cached code compiles them in, so it is checked against this file
(:func:`~stallfree.transforms.numba.disk_cache.check_cache`).
"""

from __future__ import annotations

import math

from numba.extending import register_jitable

__all__ = ["BITS", "FILTERS", "columns_first", "filter_support", "filter_weight", "fixed_weight", "span", "span_total",
           "tap_weight"]

BITS = 22  # PIL's PRECISION_BITS: 32 - 8 - 2

#: PIL's resampling filters by the code the kernels take, and each one's support (in input pixels, before widening).
FILTERS = {"bilinear": 0, "bicubic": 1, "box": 2, "hamming": 3, "lanczos": 4}
_SUPPORT = (1.0, 2.0, 0.5, 1.0, 3.0)


@register_jitable
def _sinc(x: float) -> float:
    if x == 0.0:
        return 1.0
    x *= math.pi
    return math.sin(x) / x


@register_jitable
def filter_weight(x: float, kind: int) -> float:
    """PIL's filter ``kind`` at signed distance ``x`` (``Resample.c``'s ``*_filter`` functions)."""
    if kind == 2:  # box, half-open as PIL's
        return 1.0 if -0.5 < x <= 0.5 else 0.0
    t = abs(x)
    if kind == 0:  # triangle
        return 1.0 - t if t < 1.0 else 0.0
    if kind == 1:  # cubic, a = -0.5
        if t < 1.0:
            return ((-0.5 + 2.0) * t - (-0.5 + 3.0)) * t * t + 1.0
        if t < 2.0:
            return (((t - 5.0) * t + 8.0) * t - 4.0) * -0.5
        return 0.0
    if kind == 3:  # hamming
        if t == 0.0:
            return 1.0
        if t >= 1.0:
            return 0.0
        t *= math.pi
        return math.sin(t) / t * (0.54 + 0.46 * math.cos(t))
    if -3.0 <= x < 3.0:  # lanczos, a = 3
        return _sinc(x) * _sinc(x / 3.0)
    return 0.0


@register_jitable
def filter_support(kind: int) -> float:
    """Filter ``kind``'s support in input pixels, before the filter scale widens it."""
    return _SUPPORT[0] if kind == 0 else _SUPPORT[1] if kind == 1 else _SUPPORT[2] if kind == 2 else (
        _SUPPORT[3] if kind == 3 else _SUPPORT[4])


@register_jitable
def span(i: int, in_size: int, out_size: int, antialias: bool, kind: int) -> tuple[int, int, float, float]:
    """Output index ``i``'s first input index, tap count, centre and inverse filter scale (PIL's precompute)."""
    # Conditionals, not max() and min(): numba 0.68's own CUDA target fails to type those (tests/transforms/
    # test_resample_ptx.py); the numba-cuda package may not, but the kernels must compile under either.
    scale = in_size / out_size
    filter_scale = scale if antialias and scale > 1.0 else 1.0
    inverse = 1.0 / filter_scale  # PIL multiplies by the inverse (dividing can round t the other way)
    support = filter_support(kind) * filter_scale  # the filter's own support, widened by the filter scale
    center = (i + 0.5) * scale
    first = int(center - support + 0.5)
    first = first if first > 0 else 0
    end = int(center + support + 0.5)
    count = (end if end < in_size else in_size) - first
    return first, count, center, inverse


@register_jitable
def span_total(first: int, count: int, center: float, inverse: float, kind: int) -> float:
    """The sum of the span's raw filter values, which normalises each of them."""
    total = 0.0
    for k in range(count):
        total += filter_weight((k + first - center + 0.5) * inverse, kind)
    return total


@register_jitable
def tap_weight(k: int, first: int, center: float, inverse: float, kind: int, total: float) -> float:
    """Tap ``k``'s normalised weight, in float64."""
    raw = filter_weight((k + first - center + 0.5) * inverse, kind)
    return raw / total if total != 0.0 else 0.0


@register_jitable
def fixed_weight(k: int, first: int, center: float, inverse: float, kind: int, total: float) -> int:
    """Tap ``k``'s weight in PIL's 22-bit fixed point (the uint8 resampler's)."""
    w = tap_weight(k, first, center, inverse, kind, total)
    return int(w * (1 << BITS) + (0.5 if w >= 0 else -0.5))


@register_jitable
def columns_first(height: int, width: int, out_h: int, out_w: int) -> bool:
    """Pillow 13's order of the two passes: columns first where the height shrinks by more than twice the width."""
    return height - out_h > 0 and height - out_h > 2 * (width - out_w)
