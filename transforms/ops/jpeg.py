"""torchvision v2's ``JPEG`` as a graph step: a quality drawn per sample, DALI's JPEG round trip applies it."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["JPEG"]


def _qualities(quality: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(quality, bool):
        raise TypeError("JPEG: quality can't be bool")
    if isinstance(quality, numbers.Integral):
        low = high = int(quality)
    elif isinstance(quality, Sequence) and len(quality) == 2 and all(
            isinstance(q, numbers.Integral) and not isinstance(q, bool) for q in quality):
        low, high = int(quality[0]), int(quality[1])
    else:
        raise ValueError(f"JPEG: quality must be an int or a (min, max) pair of ints, got {quality!r}")
    if not 1 <= low <= high <= 100:
        raise ValueError(f"JPEG: quality must be an integer from 1 to 100, got quality={quality!r}")
    return low, high


@dataclass(frozen=True)
class JPEG(Transform):
    """Encode as JPEG at a quality drawn uniformly in ``quality`` (an int, or ``(min, max)`` inclusive), then decode.

    torchvision v2's ``JPEG`` (``randint(min, max + 1)`` per call, ``encode_jpeg`` then ``decode_jpeg``), on uint8
    images. DALI's ``jpeg_compression_distortion`` gives torchvision's pixels to the bit on the CPU (qualities 10
    to 100 checked); on the GPU it encodes with nvJPEG.
    """

    quality: int | Sequence[int]
    params = {"quality": np.int32}

    def __post_init__(self) -> None:
        _qualities(self.quality)

    def prepare(self, state: GraphState) -> None:
        if state.dtype != "uint8":
            raise ValueError("JPEG: only uint8 images are supported (as torchvision's); put it before ToTensor / "
                             "Normalize")

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        low, high = _qualities(self.quality)
        return {"quality": np.array(rng.integers(low, high + 1), np.int32)}, size

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        import nvidia.dali.fn as fn

        self.prepare(state)
        return fn.jpeg_compression_distortion(image, quality=params["quality"], device=state.device), state
