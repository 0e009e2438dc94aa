"""Augmentations DALI does not ship, written as :mod:`~stallfree.transforms.numba.kernel` pixel functions.

Each is a :class:`~stallfree.transforms.numba.kernel.KernelTransform`: ``sample`` draws torchvision's parameters from
the sample's stream on the host, and a pixel function applies them inside the graph. Where the arithmetic depends
on the image's range (255 for uint8 before ``Normalize``, 1.0 for float after it) there is one kernel per dtype.
Noise comes from a per-sample key and :func:`~stallfree.transforms.numba.kernel.normal_at`, so it is keyed by
sample too.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.transforms.numba.kernel import Kernel, KernelTransform, kernel, normal_at
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size

__all__ = [
    "Cutout",
    "GaussianNoise",
    "Posterize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomPosterize",
    "RandomSolarize",
    "Solarize",
]

_KEYS = 2**31 - 1  # per-sample noise keys are drawn in [0, 2**31 - 1), int32 graph inputs
_WR, _WG, _WB = np.float32(0.2989), np.float32(0.587), np.float32(0.114)


def _per_dtype(make: Callable[[bool], Callable[..., None]], name: str) -> dict[str, Kernel]:
    """A uint8 and a float32 kernel from one factory (``integral`` is a compile-time constant in each)."""
    return {"uint8": kernel(make(True), name=f"{name}[uint8]"), "float32": kernel(make(False), name=f"{name}[float32]")}


def _probability(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}: p must be in [0, 1], got {p}")


# --- RandomErasing -----------------------------------------------------------------------------------------------


def _make_erase(integral: bool) -> Callable[..., None]:
    lo, hi = (0.0, 255.0) if integral else (-math.inf, math.inf)

    def erase(out: Any, image: Any, y: int, x: int, rect: Any, value: Any, key: Any) -> None:
        top, left, h, w = rect[0], rect[1], rect[2], rect[3]
        inside = top <= y < top + h and left <= x < left + w
        channels = image.shape[2]
        for c in range(channels):
            if not inside:
                out[y, x, c] = image[y, x, c]
            elif key[0] >= 0:  # value="random": torchvision's normal_() fill, indexed (c, y, x) within the box
                out[y, x, c] = normal_at(key[0], (c * h + (y - top)) * w + (x - left))
            else:
                v = value[c] if value.shape[0] > 1 else value[0]
                out[y, x, c] = min(max(v, lo), hi)

    return erase


_ERASE = _per_dtype(_make_erase, "RandomErasing")


@dataclass(frozen=True)
class RandomErasing(KernelTransform):
    """Erase a random rectangle with probability ``p`` (torchvision's ``RandomErasing``).

    The box is drawn as torchvision's ``get_params``: ten attempts at an area in ``scale`` of the image and a
    log-uniform aspect ratio (height over width) in ``ratio``, kept if it fits strictly inside; otherwise the
    image is left as it is. ``value`` is a number, one per channel, or ``"random"`` (standard normal noise, float
    images only: put the step after ``Normalize`` as torchvision's tensor pipelines do). On a uint8 image a value
    is clamped to [0, 255] and truncated, as a uint8 tensor stores it.
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float | str | Sequence[float] = 0
    params = {"rect": np.int32, "value": np.float32, "key": np.int32}  # rect: (top, left, h, w); key < 0: a value

    def __post_init__(self) -> None:
        if not isinstance(self.value, (numbers.Number, str, tuple, list)):
            raise TypeError(f"RandomErasing: value should be either a number or str or a sequence, got {self.value!r}")
        if isinstance(self.value, str) and self.value != "random":
            raise ValueError(f'RandomErasing: if value is str, it should be "random", got {self.value!r}')
        if isinstance(self.value, (tuple, list)) and len(self.value) not in (1, 3):
            raise ValueError(f"RandomErasing: a sequence value needs 1 or 3 (channels) values, got {self.value!r}")
        for arg in ("scale", "ratio"):
            if not isinstance(getattr(self, arg), Sequence) or len(getattr(self, arg)) != 2:
                raise TypeError(f"RandomErasing: {arg} should be a (min, max) sequence, got {getattr(self, arg)!r}")
        if self.scale[0] > self.scale[1] or self.ratio[0] > self.ratio[1]:
            warnings.warn("RandomErasing: scale and ratio should be of kind (min, max)", stacklevel=3)
        if self.scale[0] < 0 or self.scale[1] > 1:
            raise ValueError(f"RandomErasing: scale should be between 0 and 1, got {self.scale!r}")
        if self.ratio[0] <= 0:
            raise ValueError(f"RandomErasing: ratio must be positive, got {self.ratio!r}")
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomErasing: random erasing probability should be between 0 and 1, got {self.p}")

    def is_identity(self) -> bool:
        return self.p == 0

    def check(self, state: GraphState) -> None:
        if self.value == "random" and state.dtype == "uint8":
            raise ValueError("RandomErasing(value='random') needs a float image: put it after Normalize")

    def kernel_for(self, state: GraphState) -> Kernel:
        return _ERASE[state.dtype]

    def _fill(self) -> list[float]:
        if isinstance(self.value, str):
            return [0.0]
        if isinstance(self.value, (tuple, list)):
            return [float(v) for v in self.value]
        return [float(self.value)]  # type: ignore[arg-type]  # a number, checked in __post_init__

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        none = {"rect": [0, 0, 0, 0], "value": self._fill(), "key": [-1]}
        if not rng.random() < self.p:
            return none
        height, width = size
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            erase_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            h = int(round(math.sqrt(erase_area * aspect)))
            w = int(round(math.sqrt(erase_area / aspect)))
            if not (h < height and w < width):
                continue
            key = rng.integers(0, _KEYS) if self.value == "random" else -1  # torchvision draws v before i, j
            top = rng.integers(0, height - h + 1)
            left = rng.integers(0, width - w + 1)
            return {"rect": [top, left, h, w], "value": self._fill(), "key": [key]}
        return none


# --- Cutout ------------------------------------------------------------------------------------------------------


@kernel(name="Cutout")
def _cutout(out: Any, image: Any, y: int, x: int, holes: Any) -> None:
    inside = False
    for k in range(holes.shape[0] // 4):
        if holes[4 * k] <= y < holes[4 * k + 1] and holes[4 * k + 2] <= x < holes[4 * k + 3]:
            inside = True
    for c in range(image.shape[2]):
        out[y, x, c] = 0 if inside else image[y, x, c]


@dataclass(frozen=True)
class Cutout(KernelTransform):
    """Zero ``n_holes`` squares of side ``length`` centred on uniformly random pixels, clipped at the borders.

    DeVries and Taylor, "Improved Regularization of Convolutional Neural Networks with Cutout" (2017): each centre
    ``(cy, cx)`` is uniform over the image and the hole is rows ``[cy - length // 2, cy + length // 2)`` and the
    same columns, clipped to the image, so holes at a border are smaller. Holes may overlap.
    """

    n_holes: int = 1
    length: int = 16
    params = {"holes": np.int32}  # (y1, y2, x1, x2) per hole
    kernel = _cutout

    def __post_init__(self) -> None:
        if not isinstance(self.n_holes, int) or self.n_holes < 1:
            raise ValueError(f"Cutout: n_holes must be a positive int, got {self.n_holes!r}")
        if not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"Cutout: length must be a positive int, got {self.length!r}")

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        height, width = size
        holes: list[int] = []
        for _ in range(self.n_holes):
            cy, cx = rng.integers(0, height), rng.integers(0, width)
            half = self.length // 2
            holes += [max(cy - half, 0), min(cy + half, height), max(cx - half, 0), min(cx + half, width)]
        return {"holes": holes}


# --- GaussianNoise -----------------------------------------------------------------------------------------------


def _make_noise(integral: bool) -> Callable[..., None]:
    def noise(out: Any, image: Any, y: int, x: int, config: Any, key: Any) -> None:
        mean, sigma, clip = config[0], config[1], config[2] != 0
        width, channels = image.shape[1], image.shape[2]
        for c in range(channels):
            z = normal_at(key[0], (y * width + x) * channels + c)
            if integral:  # torchvision's uint8 path: int16(mean * 255 + randn * (sigma * 255)), added, clamped
                level = int(config[3] + np.float32(z) * config[4])  # (or wrapped, as a cast to uint8 wraps)
                v = int(image[y, x, c]) + level
                out[y, x, c] = min(max(v, 0), 255) if clip else v & 0xFF
            else:
                v = image[y, x, c] * 1.0 + mean + sigma * z
                out[y, x, c] = min(max(v, 0.0), 1.0) if clip else v

    return noise


_NOISE = _per_dtype(_make_noise, "GaussianNoise")


@dataclass(frozen=True)
class GaussianNoise(KernelTransform):
    """Add ``mean + sigma * N(0, 1)`` noise to every value, then clamp if ``clip`` (torchvision v2's GaussianNoise).

    On float images (after ``Normalize``; torchvision means [0, 1] ones) the noise is added to the values as they
    are and ``clip`` clamps to [0, 1]. On uint8 images, as torchvision's uint8 path, the noise is
    ``mean * 255 + N(0, 1) * (sigma * 255)`` in float32 truncated to an integer, and the sum is clamped to
    [0, 255] if ``clip``, else wrapped as a cast to uint8 wraps it.
    """

    mean: float = 0.0
    sigma: float = 0.1
    clip: bool = True
    params = {"config": np.float32, "key": np.int32}  # config: (mean, sigma, clip, mean * 255, sigma * 255)

    def __post_init__(self) -> None:
        if not self.sigma >= 0:
            raise ValueError(f"GaussianNoise: sigma shouldn't be negative, got sigma={self.sigma}")

    def kernel_for(self, state: GraphState) -> Kernel:
        return _NOISE[state.dtype]

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        config = [self.mean, self.sigma, float(self.clip), self.mean * 255, self.sigma * 255]
        return {"config": config, "key": [rng.integers(0, _KEYS)]}


# --- RandomSolarize, RandomPosterize, RandomGrayscale ------------------------------------------------------------


def _make_solarize(integral: bool) -> Callable[..., None]:
    bound: Any = 255 if integral else 1.0  # an int for uint8 images keeps the loop in integers

    def solarize(out: Any, image: Any, y: int, x: int, threshold: Any, apply: Any) -> None:
        for c in range(image.shape[2]):
            v = image[y, x, c]
            out[y, x, c] = bound - v if apply[0] != 0 and v >= threshold[0] else v

    return solarize


_SOLARIZE = _per_dtype(_make_solarize, "RandomSolarize")


@dataclass(frozen=True)
class RandomSolarize(KernelTransform):
    """With probability ``p``, invert every value at or above ``threshold`` (torchvision's ``RandomSolarize``).

    ``threshold`` is in the image's units: 0-255 before ``Normalize``, 0-1 after it.
    """

    threshold: float
    p: float = 0.5
    params = {"threshold": np.float32, "apply": np.int32}

    def __post_init__(self) -> None:
        _probability("RandomSolarize", self.p)

    def is_identity(self) -> bool:
        return self.p == 0

    def check(self, state: GraphState) -> None:
        bound = 255.0 if state.dtype == "uint8" else 1.0
        if self.threshold > bound:
            raise ValueError(f"RandomSolarize: threshold ({self.threshold}) should be less than the bound of a "
                             f"{state.dtype} image ({bound})")

    def kernel_for(self, state: GraphState) -> Kernel:
        return _SOLARIZE[state.dtype]

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        return {"threshold": self.threshold, "apply": int(rng.random() < self.p)}


@kernel(name="RandomPosterize")
def _posterize(out: Any, image: Any, y: int, x: int, mask: Any, apply: Any) -> None:
    for c in range(image.shape[2]):
        out[y, x, c] = image[y, x, c] & mask[0] if apply[0] != 0 else image[y, x, c]


@dataclass(frozen=True)
class RandomPosterize(KernelTransform):
    """With probability ``p``, keep only the top ``bits`` bits of each value (uint8 images, as torchvision)."""

    bits: int
    p: float = 0.5
    params = {"mask": np.int32, "apply": np.int32}
    kernel = _posterize

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or not 0 <= self.bits <= 8:
            raise ValueError(f"RandomPosterize: the number of bits should be between 0 and 8, got {self.bits!r}")
        _probability("RandomPosterize", self.p)

    def is_identity(self) -> bool:
        return self.p == 0

    def check(self, state: GraphState) -> None:
        if state.dtype != "uint8":
            raise ValueError("RandomPosterize: only uint8 images are supported; put it before Normalize")

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        return {"mask": (0xFF << (8 - self.bits)) & 0xFF, "apply": int(rng.random() < self.p)}


def _make_grayscale(integral: bool) -> Callable[..., None]:
    def grayscale(out: Any, image: Any, y: int, x: int, apply: Any) -> None:
        if apply[0] == 0:
            for c in range(image.shape[2]):
                out[y, x, c] = image[y, x, c]
            return
        v = _WR * np.float32(image[y, x, 0]) + _WG * np.float32(image[y, x, 1]) + _WB * np.float32(image[y, x, 2])
        if integral:
            v = np.float32(math.floor(v))
        for c in range(image.shape[2]):
            out[y, x, c] = v

    return grayscale


_GRAYSCALE = _per_dtype(_make_grayscale, "RandomGrayscale")


@dataclass(frozen=True)
class RandomGrayscale(KernelTransform):
    """With probability ``p``, replace RGB by its luma ``0.2989 R + 0.587 G + 0.114 B`` in all three channels.

    As torchvision's ``rgb_to_grayscale`` on tensors, the luma is computed in float32 and truncated on uint8 images.
    """

    p: float = 0.1
    params = {"apply": np.int32}

    def __post_init__(self) -> None:
        _probability("RandomGrayscale", self.p)

    def is_identity(self) -> bool:
        return self.p == 0

    def kernel_for(self, state: GraphState) -> Kernel:
        return _GRAYSCALE[state.dtype]

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        return {"apply": int(rng.random() < self.p)}


#: The issue's short names for torchvision's ``RandomSolarize`` and ``RandomPosterize``.
Solarize = RandomSolarize
Posterize = RandomPosterize
