"""Mirrors with torchvision's semantics: ``RandomHorizontalFlip`` and ``RandomVerticalFlip``, a flip bit per sample."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["RandomHorizontalFlip", "RandomVerticalFlip"]


@dataclass(frozen=True)
class RandomHorizontalFlip(Transform):
    """Mirror left to right with probability ``p``."""

    p: float = 0.5
    params = {"flip": np.int32}

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {self.p}")

    def is_identity(self) -> bool:
        return self.p == 0

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        return {"flip": np.array(rng.random() < self.p, np.int32)}, size

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        import nvidia.dali.fn as fn

        return fn.flip(image, horizontal=params["flip"], vertical=0, device=state.device), state


@dataclass(frozen=True)
class RandomVerticalFlip(Transform):
    """Mirror top to bottom with probability ``p``."""

    p: float = 0.5
    params = {"flip": np.int32}

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomVerticalFlip: p must be in [0, 1], got {self.p}")

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        return {"flip": np.array(rng.random() < self.p, np.int32)}, size

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        import nvidia.dali.fn as fn

        return fn.flip(image, horizontal=0, vertical=params["flip"], device=state.device), state
