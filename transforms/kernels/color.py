"""ColorJitter's pixel steps, float32 as torchvision computes them: Numba functions callable from njit and CUDA code.

:mod:`.color` runs :func:`jitter` (CPU) and builds the CUDA kernel from :func:`apply_steps`, :func:`gray` and
:func:`contrast_at`; :mod:`.entries` builds the cached CPU entry points from :func:`jitter`. This module imports
neither, so the three form no cycle.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba.extending import register_jitable

__all__ = ["BRIGHTNESS", "CONTRAST", "HUE", "SATURATION", "apply_steps", "contrast_at", "gray", "jitter"]

_F0, _F1 = np.float32(0.0), np.float32(1.0)
_WR, _WG, _WB = np.float32(0.2989), np.float32(0.587), np.float32(0.114)
_F2, _F4, _F6 = np.float32(2.0), np.float32(4.0), np.float32(6.0)
_U8_SCALE = np.float32(255.0)
_U8_BACK = np.float32(255.0 + 1.0 - 1e-3)  # convert_image_dtype's float -> uint8 rule
BRIGHTNESS, CONTRAST, SATURATION, HUE = 0, 1, 2, 3


# --- the pixel steps, float32 as torch computes them; callable from njit and numba.cuda code -------------------


@register_jitable
def _finish(v: Any, bound: Any, integral: bool) -> Any:
    v = min(max(v, _F0), bound)
    return np.float32(math.floor(v)) if integral else v


@register_jitable
def gray(r: Any, g: Any, b: Any, integral: bool) -> Any:
    """A pixel's grey value as torchvision's ``rgb_to_grayscale`` (truncated for uint8 images)."""
    v = _WR * r + _WG * g + _WB * b
    return np.float32(math.floor(v)) if integral else v


@register_jitable
def _blend(v: Any, other: Any, f: Any, g: Any, bound: Any, integral: bool) -> Any:
    # torchvision's _blend: ratio * img1 + (1.0 - ratio) * img2 with ratio a Python float, so torch casts ratio
    # and 1.0 - ratio (taken in double) to float32 each; g is that complement, not 1 - float32(ratio).
    return _finish(f * v + g * other, bound, integral)


@register_jitable
def _hue(r: Any, g: Any, b: Any, f: Any, integral: bool) -> tuple[Any, Any, Any]:
    if integral:
        r, g, b = r / _U8_SCALE, g / _U8_SCALE, b / _U8_SCALE
    maxc = max(r, max(g, b))
    minc = min(r, min(g, b))
    eqc = maxc == minc
    cr = maxc - minc
    s = cr / (_F1 if eqc else maxc)
    div = _F1 if eqc else cr
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    if maxc == r:
        h = bc - gc
    elif maxc == g:
        h = _F2 + rc - bc
    else:
        h = _F4 + gc - rc
    h = h / _F6 + _F1
    h = h - np.float32(math.floor(h))  # torch.fmod(h, 1.0) of a positive h
    h = h + f
    h = h - np.float32(math.floor(h))  # torch's remainder(h, 1.0)
    v = maxc
    i6 = np.float32(math.floor(h * _F6))
    fr = h * _F6 - i6
    i = int(i6) % 6
    p = min(max(v * (_F1 - s), _F0), _F1)
    q = min(max(v * (_F1 - s * fr), _F0), _F1)
    t = min(max(v * (_F1 - s * (_F1 - fr)), _F0), _F1)
    if i == 0:
        r, g, b = v, t, p
    elif i == 1:
        r, g, b = q, v, p
    elif i == 2:
        r, g, b = p, v, t
    elif i == 3:
        r, g, b = p, q, v
    elif i == 4:
        r, g, b = t, p, v
    else:
        r, g, b = v, p, q
    if integral:
        r = np.float32(math.floor(r * _U8_BACK))
        g = np.float32(math.floor(g * _U8_BACK))
        b = np.float32(math.floor(b * _U8_BACK))
    return r, g, b


@register_jitable
def apply_steps(r: Any, g: Any, b: Any, order: Any, factors: Any, upto: int, mean: Any, bound: Any,
                integral: bool) -> Any:
    """Steps ``order[0:upto]`` on one pixel; disabled steps are ``-1`` in ``order``."""
    for k in range(upto):
        op = order[k]
        f64 = factors[op] if op >= 0 else 0.0
        f, c = np.float32(f64), np.float32(1.0 - f64)
        if op == BRIGHTNESS:
            r, g, b = _blend(r, _F0, f, c, bound, integral), _blend(g, _F0, f, c, bound, integral), _blend(
                b, _F0, f, c, bound, integral
            )
        elif op == CONTRAST:
            r, g, b = _blend(r, mean, f, c, bound, integral), _blend(g, mean, f, c, bound, integral), _blend(
                b, mean, f, c, bound, integral
            )
        elif op == SATURATION:
            grey = gray(r, g, b, integral)
            r, g, b = _blend(r, grey, f, c, bound, integral), _blend(g, grey, f, c, bound, integral), _blend(
                b, grey, f, c, bound, integral
            )
        elif op == HUE:
            r, g, b = _hue(r, g, b, f, integral)
    return r, g, b


@register_jitable
def contrast_at(order: Any) -> int:
    """Where contrast comes in ``order`` (its mean is taken of the image as it is then), or -1 when it is off."""
    for k in range(4):
        if order[k] == CONTRAST:
            return k
    return -1


@register_jitable
def jitter(out: Any, image: Any, order: Any, factors: Any, bound: Any, integral: bool) -> None:
    """ColorJitter of one HWC image into ``out`` on the CPU (``bound`` 255 and ``integral`` for uint8 images)."""
    height, width = image.shape[0], image.shape[1]
    kc = contrast_at(order)
    mean = _F0
    if kc >= 0:
        total = 0.0
        for y in range(height):
            for x in range(width):
                r, g, b = apply_steps(
                    np.float32(image[y, x, 0]), np.float32(image[y, x, 1]), np.float32(image[y, x, 2]),
                    order, factors, kc, _F0, bound, integral,
                )
                total += gray(r, g, b, integral)
        mean = np.float32(total / (height * width))
    for y in range(height):
        for x in range(width):
            r, g, b = apply_steps(
                np.float32(image[y, x, 0]), np.float32(image[y, x, 1]), np.float32(image[y, x, 2]),
                order, factors, 4, mean, bound, integral,
            )
            out[y, x, 0], out[y, x, 1], out[y, x, 2] = r, g, b
