"""torchvision v2's resizes to a drawn size: ``RandomResize``, ``ScaleJitter``, ``RandomShortestSize``.

Each draws its output size on the host, from the sample's stream and its size, as torchvision's ``make_params``
does, then resizes exactly as :class:`~.resize.Resize` to that size (PIL's BILINEAR, BICUBIC or
NEAREST on the CPU graph's uint8 images). The size varies per sample, so a later step must fix it (a crop, or a
``Resize((h, w))``) before samples batch, as in the detection recipes these come from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.transforms.ops.resize import Interpolation, Resize, check_interpolation
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["RandomResize", "RandomShortestSize", "ScaleJitter"]


class _DrawnResize(Transform):
    """A resize to a size drawn per sample: the parameters and graph of a :class:`Resize` to that size."""

    changes_size = True
    antialias: bool
    interpolation: Interpolation

    @property
    def params(self) -> Mapping[str, type]:  # type: ignore[override]
        return Resize((1, 1), interpolation=self.interpolation).params

    def out_size(self, rng: SampleRandom, height: int, width: int) -> Size:
        """This sample's ``(height, width)`` after the resize."""
        raise NotImplementedError

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        out = self.out_size(rng, *size)
        if min(out) <= 0:
            raise ValueError(f"{type(self).__name__}: an image of {size} would resize to {out}; torchvision fails "
                             "on it too: raise the scale or size range")
        return Resize(out, self.antialias, interpolation=self.interpolation).draw(rng, size)

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        return Resize((1, 1), self.antialias, interpolation=self.interpolation).build(image, params, state)


@dataclass(frozen=True)
class RandomResize(_DrawnResize):
    """Resize the shorter side to a size uniform in ``[min_size, max_size)`` (torchvision's ``torch.randint``)."""

    min_size: int
    max_size: int
    interpolation: Interpolation = "bilinear"
    antialias: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.min_size < self.max_size:
            raise ValueError(f"RandomResize: needs 0 < min_size < max_size, got min_size={self.min_size}, "
                             f"max_size={self.max_size}")
        check_interpolation("RandomResize", self.interpolation)

    def out_size(self, rng: SampleRandom, height: int, width: int) -> Size:
        return Resize(rng.integers(self.min_size, self.max_size)).output_size(height, width)


@dataclass(frozen=True)
class ScaleJitter(_DrawnResize):
    """Scale to fit ``target_size`` times a factor uniform in ``scale_range`` (torchvision's, its float32 too).

    As torchvision computes it: ``r = min(target_size[1] / height, target_size[0] / width) * scale`` and each side
    ``int(side * r)``, in float32 (a ``torch.rand`` tensor), so that the sizes are torchvision's to the pixel.
    """

    target_size: tuple[int, int]
    scale_range: tuple[float, float] = (0.1, 2.0)
    interpolation: Interpolation = "bilinear"
    antialias: bool = True

    def __post_init__(self) -> None:
        if len(self.target_size) != 2 or min(self.target_size) <= 0:
            raise ValueError(f"ScaleJitter: target_size must be two positive ints, got {self.target_size!r}")
        if len(self.scale_range) != 2 or not 0 < self.scale_range[0] <= self.scale_range[1]:
            raise ValueError(f"ScaleJitter: scale_range must be (min, max) with 0 < min <= max, "
                             f"got {self.scale_range!r}")
        check_interpolation("ScaleJitter", self.interpolation)

    def out_size(self, rng: SampleRandom, height: int, width: int) -> Size:
        low, high = self.scale_range
        scale = np.float32(low) + np.float32(rng.random()) * np.float32(high - low)
        r = np.float32(min(self.target_size[1] / height, self.target_size[0] / width)) * scale
        return int(np.float32(height) * r), int(np.float32(width) * r)


@dataclass(frozen=True)
class RandomShortestSize(_DrawnResize):
    """Resize the shorter side to one of ``min_size`` (drawn uniformly), the longer kept within ``max_size``."""

    min_size: int | Sequence[int]
    max_size: int | None = None
    interpolation: Interpolation = "bilinear"
    antialias: bool = True

    def __post_init__(self) -> None:
        sizes = [self.min_size] if isinstance(self.min_size, int) else list(self.min_size)
        if not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
            raise ValueError(f"RandomShortestSize: min_size must be a positive int or ints, got {self.min_size!r}")
        if self.max_size is not None and self.max_size <= 0:
            raise ValueError(f"RandomShortestSize: max_size must be positive, got {self.max_size}")
        check_interpolation("RandomShortestSize", self.interpolation)

    def out_size(self, rng: SampleRandom, height: int, width: int) -> Size:
        sizes = [self.min_size] if isinstance(self.min_size, int) else list(self.min_size)
        r = sizes[rng.integers(0, len(sizes))] / min(height, width)
        if self.max_size is not None:
            r = min(r, self.max_size / max(height, width))
        return int(height * r), int(width * r)
