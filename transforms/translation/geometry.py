"""torchvision's geometric transforms (crops with padding, warps, drawn-size resizes) as stallfree steps.

``TRANSLATORS`` maps a torchvision class name (``transforms`` and ``transforms.v2``) to the function that turns one of
its instances into a stallfree step, with its parameters read as torchvision stores them (v1 keeps what it was given, v2
sometimes parses it: ``RandomCrop``'s padding). :mod:`.translator` consults it, as it consults
:data:`.photometric.TRANSLATORS`; the interpolation and fill checks here are the ones its own ``Resize`` and
``RandomResizedCrop`` use. Nothing here imports torchvision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stallfree.transforms import spec
from stallfree.transforms.ops.geometry import Pad, RandomCrop, RandomZoomOut
from stallfree.transforms.ops.rescale import RandomResize, RandomShortestSize, ScaleJitter
from stallfree.transforms.ops.resize import Interpolation
from stallfree.transforms.ops.warp import RandomAffine, RandomPerspective, RandomRotation

__all__ = ["TRANSLATORS", "enum_value", "fill_values", "interpolation", "is_v2"]

#: torchvision's interpolation modes (and PIL's integer codes, which it still accepts) that the spec reproduces.
_INTERPOLATIONS: dict[str, Interpolation] = {
    "bilinear": "bilinear", "2": "bilinear", "bicubic": "bicubic", "3": "bicubic", "nearest": "nearest", "0": "nearest",
    "box": "box", "4": "box", "hamming": "hamming", "5": "hamming", "lanczos": "lanczos", "1": "lanczos",
    "nearest-exact": "nearest",  # on PIL images torchvision maps NEAREST_EXACT to PIL's NEAREST (pil_modes_mapping)
}
_WARP_FILTERS = ("nearest", "bilinear", "bicubic")  # what PIL's Image.transform takes


def is_v2(obj: Any) -> bool:
    """Whether ``obj`` is one of ``torchvision.transforms.v2``'s classes."""
    return type(obj).__module__.startswith("torchvision.transforms.v2")


def enum_value(value: Any) -> str:
    """An enum's value (torchvision's ``InterpolationMode``, ``AutoAugmentPolicy``), else the value as a string."""
    return str(getattr(value, "value", value)).lower()


def interpolation(where: str, t: Any) -> tuple[Interpolation, bool]:
    """Check torchvision's interpolation/antialias arguments; the spec's ``interpolation`` and ``antialias``."""
    mode = enum_value(getattr(t, "interpolation", "bilinear"))
    if mode not in _INTERPOLATIONS:
        raise ValueError(f"{where}: {type(t).__name__}(interpolation={mode!r}) is not reproduced; stallfree resizes "
                         "as PIL's filters: use InterpolationMode.BILINEAR, BICUBIC, NEAREST, BOX, HAMMING or LANCZOS")
    antialias = getattr(t, "antialias", True)
    return _INTERPOLATIONS[mode], True if antialias is None else bool(antialias)  # None: PIL images antialias


def fill_values(where: str, t: Any) -> Any:
    """``fill`` of a padding or warping step: one number or one per channel (v2 keeps it per input type)."""
    fill = getattr(t, "fill", 0)
    if isinstance(fill, dict):
        values = list(fill.values())
        if any(v != values[0] for v in values):
            raise ValueError(f"{where}: {type(t).__name__}(fill={fill!r}) has a different fill per input type; "
                             "stallfree pads images only: pass one fill")
        fill = values[0]
    if fill is None:  # torchvision pads PIL images with 0 then
        return 0
    return tuple(fill) if isinstance(fill, (list, tuple)) else fill


def _floats(value: Any) -> Any:
    return None if value is None else tuple(float(v) for v in value)


def _pad(where: str, t: Any) -> spec.Transform:
    padding = tuple(t.padding) if isinstance(t.padding, (list, tuple)) else t.padding
    return Pad(padding, fill_values(where, t), t.padding_mode)


def _random_crop(where: str, t: Any) -> spec.Transform:
    padding = t.padding
    if isinstance(padding, (list, tuple)):
        # v2 keeps it parsed as [left, right, top, bottom]; v1 keeps what it was given
        padding = (padding[0], padding[2], padding[1], padding[3]) if is_v2(t) else tuple(padding)
    return RandomCrop(tuple(t.size), padding, bool(t.pad_if_needed), fill_values(where, t), t.padding_mode,
                      v1_padding=not is_v2(t))


def _random_zoom_out(where: str, t: Any) -> spec.Transform:
    return RandomZoomOut(fill_values(where, t), (float(t.side_range[0]), float(t.side_range[1])), float(t.p))


def _warp_interpolation(where: str, t: Any) -> Any:
    mode = _INTERPOLATIONS.get(enum_value(t.interpolation))
    if mode not in _WARP_FILTERS:
        raise ValueError(f"{where}: {type(t).__name__}(interpolation={enum_value(t.interpolation)!r}) is not "
                         "reproduced; PIL transforms with NEAREST, BILINEAR or BICUBIC: use one of those")
    return mode


def _random_rotation(where: str, t: Any) -> spec.Transform:
    return RandomRotation(_floats(t.degrees), _warp_interpolation(where, t), bool(t.expand), _floats(t.center),
                          fill_values(where, t))


def _random_affine(where: str, t: Any) -> spec.Transform:
    return RandomAffine(_floats(t.degrees), _floats(t.translate), _floats(t.scale), _floats(t.shear),
                        _warp_interpolation(where, t), fill_values(where, t), _floats(t.center))


def _random_perspective(where: str, t: Any) -> spec.Transform:
    return RandomPerspective(float(t.distortion_scale), float(t.p), _warp_interpolation(where, t),
                             fill_values(where, t))


def _random_resize(where: str, t: Any) -> spec.Transform:
    mode, antialias = interpolation(where, t)
    return RandomResize(int(t.min_size), int(t.max_size), mode, antialias)


def _scale_jitter(where: str, t: Any) -> spec.Transform:
    mode, antialias = interpolation(where, t)
    target = (int(t.target_size[0]), int(t.target_size[1]))
    return ScaleJitter(target, (float(t.scale_range[0]), float(t.scale_range[1])), mode, antialias)


def _random_shortest_size(where: str, t: Any) -> spec.Transform:
    mode, antialias = interpolation(where, t)
    return RandomShortestSize(tuple(int(s) for s in t.min_size), t.max_size, mode, antialias)


TRANSLATORS: dict[str, Callable[[str, Any], spec.Transform]] = {
    "Pad": _pad,
    "RandomCrop": _random_crop,
    "RandomZoomOut": _random_zoom_out,
    "RandomRotation": _random_rotation,
    "RandomAffine": _random_affine,
    "RandomPerspective": _random_perspective,
    "RandomResize": _random_resize,
    "ScaleJitter": _scale_jitter,
    "RandomShortestSize": _random_shortest_size,
}
