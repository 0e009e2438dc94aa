"""torchvision's ``GaussianBlur`` as a graph step: sigma drawn per sample, DALI's ``gaussian_blur`` applies it."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["GaussianBlur"]


def _blur_sizes(kernel_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(kernel_size, numbers.Integral) and not isinstance(kernel_size, bool):
        kx = ky = int(kernel_size)
    elif isinstance(kernel_size, Sequence) and len(kernel_size) in (1, 2) and all(
            isinstance(k, numbers.Integral) for k in kernel_size):
        kx, ky = int(kernel_size[0]), int(kernel_size[-1])
    else:
        raise ValueError(f"GaussianBlur: kernel_size should be an int or a (kx, ky) pair of ints, got {kernel_size!r}")
    if kx <= 0 or ky <= 0 or kx % 2 == 0 or ky % 2 == 0:
        raise ValueError(f"GaussianBlur: kernel size value should be an odd and positive number, got {kernel_size!r}")
    return kx, ky


def _blur_sigma(sigma: float | Sequence[float]) -> tuple[float, float]:
    if isinstance(sigma, numbers.Real) and not isinstance(sigma, bool):
        if sigma <= 0:
            raise ValueError(f"GaussianBlur: if sigma is a single number, it must be positive, got {sigma}")
        return float(sigma), float(sigma)
    if isinstance(sigma, Sequence) and len(sigma) == 2:
        low, high = float(sigma[0]), float(sigma[1])
        if not 0.0 < low <= high:
            raise ValueError(f"GaussianBlur: sigma values should be positive and of the form (min, max), got {sigma!r}")
        return low, high
    raise ValueError(f"GaussianBlur: sigma should be a single number or a (min, max) pair, got {sigma!r}")


@dataclass(frozen=True)
class GaussianBlur(Transform):
    """Blur with a Gaussian of ``kernel_size`` ``(kx, ky)`` and ``sigma`` drawn uniformly in ``sigma`` per sample.

    torchvision's ``GaussianBlur``: the same sigma along both axes, drawn as ``uniform_(min, max)`` (a single
    number is ``(s, s)``), a sum-normalised Gaussian window, borders reflected without repeating the edge
    (``reflect``, DALI's reflect-101), and uint8 results rounded. DALI's ``gaussian_blur`` applies it separably:
    on uint8 images a value whose exact result lies within float32 error of a half level can round the other way
    (one level; 10 of 661,590 values over kernel sizes 1 to 11 and sigmas 0.1 to 5), on float images it is within
    3e-7 of torchvision's.
    """

    kernel_size: int | Sequence[int]
    sigma: float | Sequence[float] = (0.1, 2.0)
    params = {"sigma": np.float32}  # (along height, along width)

    def __post_init__(self) -> None:
        _blur_sizes(self.kernel_size)
        _blur_sigma(self.sigma)

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        low, high = _blur_sigma(self.sigma)
        s = rng.uniform(low, high)
        return {"sigma": np.array([s, s], np.float32)}, size

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        import nvidia.dali.fn as fn

        kx, ky = _blur_sizes(self.kernel_size)
        return fn.gaussian_blur(image, window_size=[ky, kx], sigma=params["sigma"], device=state.device), state
