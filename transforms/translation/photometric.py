"""torchvision's photometric transform classes, translated into stallfree's steps.

``TRANSLATORS`` maps a torchvision class name to the function that turns one of its instances into a stallfree
step; :mod:`.translator` consults it for the names it does not handle itself. The steps live in
:mod:`stallfree.transforms.ops`: ``adjust`` (invert, autocontrast, equalize, sharpness), ``blur``, ``bundled``
(solarize, posterize, noise), ``color`` (the photometric distortion, the channel permutation), ``jpeg`` and
``augmix``. A v2 class gets v2's arithmetic where the two APIs round differently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from stallfree.transforms import spec
from stallfree.transforms.ops.adjust import (
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomInvert,
)
from stallfree.transforms.ops.augmix import AugMix
from stallfree.transforms.ops.blur import GaussianBlur
from stallfree.transforms.ops.bundled import GaussianNoise, RandomPosterize, RandomSolarize
from stallfree.transforms.ops.color import RandomChannelPermutation, RandomPhotometricDistort
from stallfree.transforms.ops.jpeg import JPEG
from stallfree.transforms.translation.geometry import enum_value, fill_values, is_v2

__all__ = ["TRANSLATORS"]


def _api(t: Any) -> Literal["v1", "v2"]:
    return "v2" if is_v2(t) else "v1"


def _augmix(where: str, t: Any) -> spec.Transform:
    mode = enum_value(t.interpolation)
    if mode not in ("nearest", "bilinear"):
        raise ValueError(f"{where}: AugMix(interpolation={mode!r}) is not reproduced; use NEAREST or BILINEAR")
    fill = fill_values(where, t)  # torchvision's fill=None warps in zeros: 0
    if isinstance(fill, tuple) and len(set(fill)) == 1:
        fill = fill[0]
    if isinstance(fill, tuple):
        raise ValueError(f"{where}: AugMix(fill={list(fill)!r}) is not reproduced; stallfree's AugMix takes one fill "
                         "value")
    return AugMix(int(t.severity), int(t.mixture_width), int(t.chain_depth), float(t.alpha), bool(t.all_ops),
                  mode, float(fill), _api(t))  # type: ignore[arg-type]


TRANSLATORS: dict[str, Callable[[str, Any], spec.Transform]] = {
    "RandomSolarize": lambda where, t: RandomSolarize(float(t.threshold), float(t.p)),
    "RandomPosterize": lambda where, t: RandomPosterize(int(t.bits), float(t.p)),
    "RandomInvert": lambda where, t: RandomInvert(float(t.p)),
    "RandomAutocontrast": lambda where, t: RandomAutocontrast(float(t.p), _api(t)),
    "RandomEqualize": lambda where, t: RandomEqualize(float(t.p)),
    "RandomAdjustSharpness": lambda where, t: RandomAdjustSharpness(float(t.sharpness_factor), float(t.p), _api(t)),
    "RandomPhotometricDistort": lambda where, t: RandomPhotometricDistort(
        tuple(t.brightness), tuple(t.contrast), tuple(t.saturation), tuple(t.hue), float(t.p)),
    "RandomChannelPermutation": lambda where, t: RandomChannelPermutation(),
    "GaussianNoise": lambda where, t: GaussianNoise(float(t.mean), float(t.sigma), bool(t.clip)),
    "AugMix": _augmix,
    "JPEG": lambda where, t: JPEG(tuple(int(q) for q in t.quality)),
    "GaussianBlur": lambda where, t: GaussianBlur(tuple(int(k) for k in t.kernel_size),
                                                  tuple(float(s) for s in t.sigma)),
}
