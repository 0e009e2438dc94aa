"""Padding and crops with torchvision's semantics: ``Pad``, ``RandomCrop`` (the CIFAR recipe), ``CenterCrop``.

Each is a window of the padded image. ``CenterCrop``'s is the centre, with torchvision's rounding and zeros where the
image is smaller; ``RandomCrop``'s is drawn by the host from the sample's stream and its size, exactly as torchvision
draws it (``RandomCrop.get_params``: the top row, then the left column, each uniform). The graph cuts the window out
of the unpadded image:

    padding_mode="constant"                 one ``fn.slice`` whose window runs over the image's edge, the rest
                                            filled with ``fill`` (per channel): CPU and GPU
    "edge", "reflect", "symmetric"          :mod:`~stallfree.transforms.kernels.gather` on row and column
                                            tables made with ``np.pad``, which is what torchvision pads PIL
                                            images with: CPU

Either way the result equals torchvision's on a PIL image to the bit (``tests/transforms/ops/test_geometry.py``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform, size_pair

__all__ = ["CenterCrop", "Pad", "RandomCrop", "RandomZoomOut", "fill_per_channel", "padding_table"]

PaddingMode = Literal["constant", "edge", "reflect", "symmetric"]
MODES = ("constant", "edge", "reflect", "symmetric")
Fill = float | Sequence[float]


def _padding(name: str, padding: int | Sequence[int]) -> tuple[int, int, int, int]:
    """Torchvision's padding argument as ``(left, top, right, bottom)``."""
    if isinstance(padding, numbers.Integral) and not isinstance(padding, bool):
        values = (int(padding),) * 4
    elif isinstance(padding, Sequence) and len(padding) in (1, 2, 4) and all(
        isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in padding
    ):
        p = [int(v) for v in padding]
        values = (p[0],) * 4 if len(p) == 1 else (p[0], p[1], p[0], p[1]) if len(p) == 2 else (p[0], p[1], p[2], p[3])
    else:
        raise ValueError(f"{name}: padding must be an int or a sequence of 1, 2 or 4 ints, got {padding!r}")
    if min(values) < 0:
        raise ValueError(f"{name}: negative padding (a crop) is not reproduced, got padding={padding!r}; crop with "
                         "CenterCrop or RandomCrop instead")
    return values[0], values[1], values[2], values[3]


def fill_per_channel(name: str, fill: Fill) -> tuple[float, float, float]:
    """``fill`` as one value per channel (RGB), as torchvision's ``_parse_fill`` broadcasts it."""
    if isinstance(fill, numbers.Real) and not isinstance(fill, bool):
        return (float(fill),) * 3
    if isinstance(fill, Sequence) and len(fill) in (1, 3) and all(isinstance(v, numbers.Real) for v in fill):
        values = [float(v) for v in fill] * (3 // len(fill))
        return values[0], values[1], values[2]
    raise ValueError(f"{name}: fill must be a number or 1 or 3 numbers (one per channel), got {fill!r}")


def _mode(name: str, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"{name}: padding_mode must be one of {MODES}, got {mode!r}")


def padding_table(length: int, stages: Sequence[tuple[int, int]], mode: str, start: int, count: int) -> np.ndarray:
    """Source indices of padded positions ``start .. start + count`` along an axis of ``length`` (``-1``: fill).

    Each stage ``(before, after)`` pads the result of the one before, with ``np.pad(..., mode)``: how torchvision
    pads PIL images in every mode but ``constant`` (where the padding is ``fill``). Stages compose: reflecting an
    image that was reflected already is not one reflection by the sum (torchvision v1's ``RandomCrop`` pads twice).
    """
    table = np.arange(length)
    for before, after in stages:
        if mode == "constant":
            table = np.concatenate([np.full(before, -1), table, np.full(after, -1)])
        else:
            table = table[np.pad(np.arange(len(table)), (before, after), mode=mode)]  # type: ignore[call-overload]
    return np.ascontiguousarray(table[start : start + count], np.int32)


def _check_fill(name: str, fill: tuple[float, float, float], state: GraphState) -> None:
    if state.dtype == "uint8" and not all(0 <= v < 256 for v in fill):
        raise ValueError(f"{name}: fill {fill!r} is outside a uint8 image's 0..255 (torchvision's PIL fill)")


def _window_node(
    name: str, image: Any, window: Any, tables: Mapping[str, Any] | None, fill: tuple[float, float, float],
    mode: str, state: GraphState,
) -> Any:
    """The window of the padded image: a slice that pads (``constant``), else a gather of the tables."""
    import nvidia.dali.fn as fn

    if mode == "constant":
        # torchvision (PIL) truncates a float fill to the image's integers.
        values = [float(int(v)) for v in fill] if state.dtype == "uint8" else list(fill)
        return fn.slice(
            image,
            start=window[0:2],
            shape=window[2:4],
            axis_names="HW",
            out_of_bounds_policy="pad",
            fill_values=values,
            device=state.device,
        )
    if state.device != "cpu":
        raise ValueError(f"{name}(padding_mode={mode!r}) runs on the CPU graph only (DALI pads with a constant); "
                         "use padding_mode='constant', or run the Loader's graph on the CPU")
    from stallfree.transforms.kernels.gather import gather_node

    assert tables is not None
    return gather_node(image, tables["rows"], tables["cols"], [0.0, 0.0, 0.0], dtype=state.dtype)


@dataclass(frozen=True)
class Pad(Transform):
    """Pad every side (torchvision's ``Pad``): ``padding`` is an int, ``(left/right, top/bottom)`` or 4 values.

    ``fill`` is one value or one per channel (on the image's scale: 0..255 before ``Normalize``); ``padding_mode``
    ``"constant"`` fills, ``"edge"`` repeats the border, ``"reflect"`` mirrors without repeating it and
    ``"symmetric"`` with it (numpy's ``np.pad`` modes).
    """

    padding: int | Sequence[int]
    fill: Fill = 0
    padding_mode: PaddingMode = "constant"
    changes_size = True

    def __post_init__(self) -> None:
        _padding("Pad", self.padding)
        fill_per_channel("Pad", self.fill)
        _mode("Pad", self.padding_mode)

    @property
    def params(self) -> Mapping[str, type]:  # type: ignore[override]
        if self.padding_mode == "constant":
            return {"window": np.int32}  # (top, left, height, width) in the unpadded image's pixels
        return {"rows": np.int32, "cols": np.int32}

    def is_identity(self) -> bool:
        return _padding("Pad", self.padding) == (0, 0, 0, 0)

    def prepare(self, state: GraphState) -> None:
        _check_fill("Pad", fill_per_channel("Pad", self.fill), state)

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        left, top, right, bottom = _padding("Pad", self.padding)
        height, width = size[0] + top + bottom, size[1] + left + right
        if self.padding_mode == "constant":
            return {"window": np.array([-top, -left, height, width], np.int32)}, (height, width)
        rows = padding_table(size[0], [(top, bottom)], self.padding_mode, 0, height)
        cols = padding_table(size[1], [(left, right)], self.padding_mode, 0, width)
        return {"rows": rows, "cols": cols}, (height, width)

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        constant = self.padding_mode == "constant"
        window = params["window"] if constant else None
        tables = None if constant else {"rows": params["rows"], "cols": params["cols"]}
        node = _window_node("Pad", image, window, tables, fill_per_channel("Pad", self.fill), self.padding_mode, state)
        return node, state


@dataclass(frozen=True)
class RandomCrop(Transform):
    """Crop a random ``size`` window, after padding (torchvision's ``RandomCrop``, v1 and v2).

    ``padding`` pads first, as :class:`Pad`; ``pad_if_needed`` then pads each side of a dimension smaller than the
    crop by the shortfall (torchvision pads both sides by it); ``v1_padding``: see :meth:`stages`. A crop larger
    than the (padded) image raises torchvision's ``ValueError`` when that sample is drawn.
    """

    size: int | Sequence[int]
    padding: int | Sequence[int] | None = None
    pad_if_needed: bool = False
    fill: Fill = 0
    padding_mode: PaddingMode = "constant"
    v1_padding: bool = False
    changes_size = True

    def __post_init__(self) -> None:
        size_pair("RandomCrop", self.size)
        if self.padding is not None:
            _padding("RandomCrop", self.padding)
        fill_per_channel("RandomCrop", self.fill)
        _mode("RandomCrop", self.padding_mode)

    @property
    def params(self) -> Mapping[str, type]:  # type: ignore[override]
        if self.padding_mode == "constant":
            return {"window": np.int32}  # (top, left, height, width) in the unpadded image's pixels
        return {"rows": np.int32, "cols": np.int32}

    def fixed_size(self) -> Size:
        return size_pair("RandomCrop", self.size)

    def prepare(self, state: GraphState) -> None:
        _check_fill("RandomCrop", fill_per_channel("RandomCrop", self.fill), state)

    def stages(self, height: int, width: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The ``(before, after)`` padding stages of the rows and of the columns, ``pad_if_needed`` included.

        v2 (and this class by default) pads once by ``padding`` plus the shortfall; with ``v1_padding``, the
        shortfall pads the padded image again, as ``torchvision.transforms.RandomCrop`` does (the two differ in the
        reflect and symmetric modes only).
        """
        left, top, right, bottom = (0, 0, 0, 0) if self.padding is None else _padding("RandomCrop", self.padding)
        crop_h, crop_w = self.fixed_size()
        short_h = max(0, crop_h - (height + top + bottom)) if self.pad_if_needed else 0
        short_w = max(0, crop_w - (width + left + right)) if self.pad_if_needed else 0
        if self.v1_padding:
            return [(top, bottom), (short_h, short_h)], [(left, right), (short_w, short_w)]
        return [(top + short_h, bottom + short_h)], [(left + short_w, right + short_w)]

    def window(self, rng: SampleRandom, height: int, width: int) -> tuple[int, int]:
        """``(top, left)`` of the crop in the padded image: torchvision's draws, the top row first."""
        row_stages, col_stages = self.stages(height, width)
        padded_h = height + sum(a + b for a, b in row_stages)
        padded_w = width + sum(a + b for a, b in col_stages)
        crop_h, crop_w = self.fixed_size()
        if padded_h < crop_h or padded_w < crop_w:
            raise ValueError(
                f"RandomCrop: required crop size {(crop_h, crop_w)} is larger than the "
                f"{'padded ' if self.padding is not None else ''}input image size {(padded_h, padded_w)}; "
                "pass pad_if_needed=True or a larger padding"
            )
        top = rng.integers(0, padded_h - crop_h + 1) if padded_h > crop_h else 0
        left = rng.integers(0, padded_w - crop_w + 1) if padded_w > crop_w else 0
        return top, left

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        height, width = size
        top, left = self.window(rng, height, width)
        row_stages, col_stages = self.stages(height, width)
        crop_h, crop_w = self.fixed_size()
        if self.padding_mode == "constant":
            top_pad, left_pad = sum(a for a, _ in row_stages), sum(a for a, _ in col_stages)
            return {"window": np.array([top - top_pad, left - left_pad, crop_h, crop_w], np.int32)}, (crop_h, crop_w)
        rows = padding_table(height, row_stages, self.padding_mode, top, crop_h)
        cols = padding_table(width, col_stages, self.padding_mode, left, crop_w)
        return {"rows": rows, "cols": cols}, (crop_h, crop_w)

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        constant = self.padding_mode == "constant"
        window = params["window"] if constant else None
        tables = None if constant else {"rows": params["rows"], "cols": params["cols"]}
        fill = fill_per_channel("RandomCrop", self.fill)
        node = _window_node("RandomCrop", image, window, tables, fill, self.padding_mode, state)
        return node, state


@dataclass(frozen=True)
class RandomZoomOut(Transform):
    """With probability ``p``, place the image at a random spot of a canvas ``side_range`` times its size (v2's).

    The canvas is filled with ``fill``; its scale and the image's place are drawn as torchvision's ``make_params``
    draws them, in its float32 (``torch.rand`` tensors), so that the sizes and offsets are torchvision's to the
    pixel given the same uniforms. The size varies per sample: a later step must fix it.
    """

    fill: Fill = 0
    side_range: tuple[float, float] = (1.0, 4.0)
    p: float = 0.5
    params = {"window": np.int32}  # (top, left, height, width) in the image's pixels, as Pad's
    changes_size = True

    def __post_init__(self) -> None:
        fill_per_channel("RandomZoomOut", self.fill)
        if len(self.side_range) != 2 or not 1.0 <= self.side_range[0] <= self.side_range[1]:
            raise ValueError(f"RandomZoomOut: side_range must be (min, max) with 1 <= min <= max, "
                             f"got {self.side_range!r}")
        if not 0 <= self.p <= 1:
            raise ValueError(f"RandomZoomOut: p must be in [0, 1], got {self.p}")

    def is_identity(self) -> bool:
        return self.p == 0

    def prepare(self, state: GraphState) -> None:
        _check_fill("RandomZoomOut", fill_per_channel("RandomZoomOut", self.fill), state)

    def padding(self, rng: SampleRandom, height: int, width: int) -> tuple[int, int, int, int]:
        """``(left, top, right, bottom)``: zero where the draw keeps the image as it is."""
        if not rng.random() < self.p:
            return 0, 0, 0, 0
        low, high = self.side_range
        r = np.float32(low) + np.float32(rng.random()) * np.float32(high - low)
        canvas_w, canvas_h = int(np.float32(width) * r), int(np.float32(height) * r)
        left = int(np.float32(canvas_w - width) * np.float32(rng.random()))
        top = int(np.float32(canvas_h - height) * np.float32(rng.random()))
        return left, top, canvas_w - (left + width), canvas_h - (top + height)

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        left, top, right, bottom = self.padding(rng, *size)
        height, width = size[0] + top + bottom, size[1] + left + right
        return {"window": np.array([-top, -left, height, width], np.int32)}, (height, width)

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        fill = fill_per_channel("RandomZoomOut", self.fill)
        return _window_node("RandomZoomOut", image, params["window"], None, fill, "constant", state), state


@dataclass(frozen=True)
class CenterCrop(Transform):
    """Crop the centre ``size`` window, padding with zeros where the image is smaller (as torchvision)."""

    size: int | Sequence[int]
    params = {"anchor": np.int32}  # (top, left); negative where torchvision pads
    changes_size = True

    def __post_init__(self) -> None:
        size_pair("CenterCrop", self.size)

    def fixed_size(self) -> Size:
        return size_pair("CenterCrop", self.size)

    def anchor(self, height: int, width: int) -> tuple[int, int]:
        """Top-left corner of the crop in the unpadded image (torchvision's rounding and padding)."""
        crop_h, crop_w = self.fixed_size()
        top = -((crop_h - height) // 2) if crop_h > height else int(round((height - crop_h) / 2.0))
        left = -((crop_w - width) // 2) if crop_w > width else int(round((width - crop_w) / 2.0))
        return top, left

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        return {"anchor": np.array(self.anchor(*size), np.int32)}, self.fixed_size()

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        import nvidia.dali.fn as fn

        cropped = fn.slice(
            image,
            start=params["anchor"],
            shape=list(self.fixed_size()),
            axis_names="HW",
            out_of_bounds_policy="pad",
            fill_values=0,
            device=state.device,
        )
        return cropped, state
