"""Resizes with torchvision's semantics: ``RandomResizedCrop`` and ``Resize``, PIL's filters to the bit.

Every filter but nearest goes through the resampler (:mod:`stallfree.transforms.kernels.resample_node`), PIL's filter
as torchvision resizes PIL images, on the CPU (Numba) or the GPU (``numba.cuda``) alike: uint8 as PIL rounds, floats
after ``Normalize`` in float. NEAREST picks PIL's source rows and columns, drawn on the host
(:func:`nearest_table`). The interpolation names here are also those of the drawn-size resizes
(:mod:`.rescale`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform, size_input, size_pair

__all__ = ["INTERPOLATIONS", "Interpolation", "RandomResizedCrop", "Resize", "check_interpolation", "nearest_table"]

Interpolation = Literal["bilinear", "bicubic", "nearest", "box", "hamming", "lanczos"]
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "box", "hamming", "lanczos")
_PIL_FILTERS = {"bilinear": 0, "bicubic": 1, "box": 2, "hamming": 3, "lanczos": 4}  # kernels.filters.FILTERS


def _range_pair(name: str, arg: str, value: Sequence[float], low: float = 0.0) -> tuple[float, float]:
    if not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"{name}: {arg} must be a (min, max) pair, got {value!r}")
    a, b = float(value[0]), float(value[1])
    if not (low <= a <= b) or not math.isfinite(b):
        raise ValueError(f"{name}: {arg} must satisfy {low} <= min <= max, got {value!r}")
    return a, b


def check_interpolation(name: str, interpolation: str) -> None:
    """Refuse an ``interpolation`` the resizes do not reproduce, naming the step."""
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"{name}: interpolation must be one of {INTERPOLATIONS} (PIL's filters of those names), "
                         f"got {interpolation!r}")


def nearest_table(length: int, out: int) -> np.ndarray:
    """The source index of each of ``out`` positions resizing ``length`` ones: PIL's NEAREST.

    PIL walks the source in double precision, adding the scale once per output position (``ImagingScaleAffine``);
    the same additions here give its indices exactly, where ``floor((i + 0.5) * scale)`` differs at some sizes.
    """
    scale, position = length / out, length / out * 0.5
    table = np.empty(out, np.int32)
    for i in range(out):
        table[i] = int(position)
        position += scale
    return table


def _resize(
    image: Any, size: Any, state: GraphState, antialias: bool, window: Any = None,
    interpolation: Interpolation = "bilinear",
) -> Any:
    """Resize to the per-sample ``size`` (a :func:`size_input` node), after cropping to ``window`` if given.

    Every filter but nearest goes through the resampler, PIL's filter (torchvision's resize of PIL images), on the
    CPU (Numba) or the GPU (``numba.cuda``) alike: uint8 as PIL rounds, floats after ``Normalize`` in float. Nearest
    uses ``fn.resize``.
    """
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    if interpolation != "nearest":  # PIL's filter on either device, in uint8 or (after Normalize) in float
        from stallfree.transforms.kernels.resample_node import resize_float_node, resize_node

        node = resize_node if state.dtype == "uint8" else resize_float_node
        return node(image, size, antialias=antialias, window=window, kind=_PIL_FILTERS[interpolation],
                    device=state.device)
    roi: dict[str, Any] = {}
    if window is not None:
        roi = {"roi_start": window[0:2], "roi_end": window[0:2] + window[2:4], "roi_relative": False}
    interp = {"bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC, "nearest": types.INTERP_NN,
              "lanczos": types.INTERP_LANCZOS3}
    if interpolation not in interp:
        raise ValueError(f"interpolation={interpolation!r} runs on the CPU graph's uint8 images only (PIL's filter, "
                         "which DALI's fn.resize does not have): resize before Normalize, or on the CPU graph")
    return fn.resize(
        image,
        size=size.shape(dtype=types.FLOAT)[0:2],
        interp_type=interp[interpolation],
        antialias=antialias,
        device=state.device,
        **roi,
    )


def _nearest(image: Any, params: Mapping[str, Any], state: GraphState) -> Any:
    """PIL's NEAREST from the drawn ``rows`` and ``cols`` tables: a gather on the CPU (exact), else ``fn.resize``."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    rows, cols = params["rows"], params["cols"]
    if state.device == "cpu":
        from stallfree.transforms.kernels.gather import gather_node

        return gather_node(image, rows, cols, [0.0, 0.0, 0.0], dtype=state.dtype)
    size = fn.cat(rows.shape(dtype=types.FLOAT), cols.shape(dtype=types.FLOAT))  # the tables' lengths
    return fn.resize(image, size=size, interp_type=types.INTERP_NN, antialias=False, device=state.device)


@dataclass(frozen=True)
class RandomResizedCrop(Transform):
    """Crop a random window of random area and aspect ratio, then resize it to ``size`` (torchvision's algorithm).

    The window is drawn as ``torchvision.transforms.RandomResizedCrop.get_params`` draws it: ten attempts at a
    window with area in ``scale`` of the image and log-uniform aspect ratio in ``ratio``, falling back to a
    centre crop clamped to ``ratio``. As the first step over encoded images, only the window is decoded.
    ``interpolation`` as :class:`Resize`'s.
    """

    size: int | Sequence[int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    antialias: bool = True
    interpolation: Interpolation = "bilinear"
    changes_size = True

    @property
    def params(self) -> Mapping[str, type]:  # type: ignore[override]
        if self.interpolation == "nearest":  # the window, then PIL's source rows and columns within it
            return {"window": np.float32, "rows": np.int32, "cols": np.int32}
        return {"window": np.float32, "size": np.uint8}  # (top, left, height, width) in pixels; see size_input

    def __post_init__(self) -> None:
        size_pair("RandomResizedCrop", self.size)
        check_interpolation("RandomResizedCrop", self.interpolation)
        a, b = _range_pair("RandomResizedCrop", "scale", self.scale)
        if b <= 0 or b > 1:
            raise ValueError(f"RandomResizedCrop: scale must lie in (0, 1], got {self.scale!r}")
        _range_pair("RandomResizedCrop", "ratio", self.ratio, low=1e-6)

    def fixed_size(self) -> Size:
        return size_pair("RandomResizedCrop", self.size)

    def window(self, rng: SampleRandom, height: int, width: int) -> tuple[int, int, int, int]:
        """``(top, left, height, width)`` of the crop window, torchvision's ``get_params``."""
        area = height * width
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = rng.log_uniform(self.ratio[0], self.ratio[1])
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = rng.integers(0, height - h + 1)
                left = rng.integers(0, width - w + 1)
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h, w = height, int(round(height * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        window = np.array(self.window(rng, *size), np.float32)
        out = self.fixed_size()
        if self.interpolation == "nearest":
            rows, cols = nearest_table(int(window[2]), out[0]), nearest_table(int(window[3]), out[1])
            return {"window": window, "rows": rows, "cols": cols}, out
        return {"window": window, "size": size_input(out)}, out

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        if self.interpolation == "nearest":
            import nvidia.dali.fn as fn
            import nvidia.dali.types as types

            window = fn.cast(params["window"], dtype=types.INT32)  # whole pixels, as drawn
            crop = fn.slice(image, start=window[0:2], shape=window[2:4], axis_names="HW", device=state.device)
            return _nearest(crop, params, state), state
        return _resize(image, params["size"], state, self.antialias, params["window"], self.interpolation), state

    def build_decoded_window(
        self, image: Any, params: Mapping[str, Any], state: GraphState
    ) -> tuple[Any, GraphState]:
        """Resize an image that was decoded to the window already (region-of-interest decoding)."""
        if self.interpolation == "nearest":
            return _nearest(image, params, state), state
        return _resize(image, params["size"], state, self.antialias, interpolation=self.interpolation), state


@dataclass(frozen=True)
class Resize(Transform):
    """Resize to ``size``: an int sets the shorter side (the longer keeps the aspect ratio, as torchvision).

    ``interpolation`` is PIL's filter of that name, as torchvision resizes PIL images: ``"bilinear"`` (the default),
    ``"bicubic"`` (the a = -0.5 cubic), ``"box"``, ``"hamming"`` and ``"lanczos"`` run through the resampler,
    ``"nearest"`` picks PIL's source pixels; all equal PIL's output to the bit on the CPU graph's uint8 images.
    """

    size: int | Sequence[int]
    antialias: bool = True
    max_size: int | None = None
    interpolation: Interpolation = "bilinear"
    changes_size = True

    @property
    def params(self) -> Mapping[str, type]:  # type: ignore[override]
        if self.interpolation == "nearest":
            return {"rows": np.int32, "cols": np.int32}  # PIL's source row of each output row, and column
        return {"size": np.uint8}  # (height, width) after resizing; see size_input

    def __post_init__(self) -> None:
        size_pair("Resize", self.size)
        check_interpolation("Resize", self.interpolation)
        if self.max_size is not None:
            if not isinstance(self.size, int):
                raise ValueError(f"Resize: max_size needs an int size, got size={self.size!r}")
            if self.max_size <= self.size:
                raise ValueError(f"Resize: max_size ({self.max_size}) must exceed size ({self.size})")

    def fixed_size(self) -> Size | None:
        return None if isinstance(self.size, int) else size_pair("Resize", self.size)

    def output_size(self, height: int, width: int) -> Size:
        """Torchvision's ``_compute_resized_output_size``."""
        if not isinstance(self.size, int):
            return size_pair("Resize", self.size)
        short, long = (height, width) if height <= width else (width, height)
        new_short, new_long = self.size, int(self.size * long / short)
        if self.max_size is not None and new_long > self.max_size:
            new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
        return (new_short, new_long) if height <= width else (new_long, new_short)

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        out = self.output_size(*size)
        if self.interpolation == "nearest":
            return {"rows": nearest_table(size[0], out[0]), "cols": nearest_table(size[1], out[1])}, out
        return {"size": size_input(out)}, out

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        if self.interpolation == "nearest":
            return _nearest(image, params, state), state
        return _resize(image, params["size"], state, self.antialias, interpolation=self.interpolation), state
