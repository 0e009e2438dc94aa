"""``Normalize``: torchvision's ``ToTensor()`` then ``Normalize(mean, std)``, where the image becomes float32."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stallfree.transforms.spec import GraphState, Transform

__all__ = ["Normalize"]


@dataclass(frozen=True)
class Normalize(Transform):
    """``(x / 255 - mean) / std`` per channel: torchvision's ``ToTensor()`` then ``Normalize(mean, std)``.

    ``mean`` and ``std`` are on torchvision's [0, 1] scale, one value per channel or one for all (as torchvision
    broadcasts). The output is float32 (or the Loader's ``dtype``). Means above 1 are DALI's 0-255 convention
    (``crop_mirror_normalize(mean=[123.675, ...])``), which on this scale would push every pixel far below zero:
    they are kept, with a warning that says how to convert them.
    """

    mean: Sequence[float] = field(default=(0.485, 0.456, 0.406))
    std: Sequence[float] = field(default=(0.229, 0.224, 0.225))

    def __post_init__(self) -> None:
        if len(self.mean) not in (1, 3) or len(self.std) not in (1, 3):
            raise ValueError(f"Normalize: mean and std need 1 or 3 values, got mean={self.mean!r} std={self.std!r}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"Normalize: std must be positive, got {self.std!r}")
        if any(m > 1.0 for m in self.mean):
            fixed = ", ".join(f"{m / 255:.4g}" for m in self.mean)
            warnings.warn(
                f"Normalize(mean={list(self.mean)!r}) looks like DALI's 0-255 convention, but stallfree's Normalize "
                f"divides by 255 first (torchvision's ToTensor + Normalize, on [0, 1]); divide mean and std by 255: "
                f"Normalize(mean=({fixed}), ...)",
                UserWarning,
                stacklevel=3,
            )

    def scaled(self, state: GraphState) -> tuple[list[float], list[float]]:
        """``mean`` and ``std`` per channel (3), on the scale of the image in ``state`` (0..255 for uint8)."""
        scale = 255.0 if state.dtype == "uint8" else 1.0
        mean = list(self.mean) * (3 // len(self.mean))
        std = list(self.std) * (3 // len(self.std))
        return [m * scale for m in mean], [s * scale for s in std]

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        mean, std = self.scaled(state)
        normalized = fn.crop_mirror_normalize(
            image,
            mean=mean,
            std=std,
            dtype=types.FLOAT,
            output_layout="HWC",
            device=state.device,
        )
        return normalized, GraphState(state.device, "float32")
