"""``ColorJitter`` with torchvision's semantics, as one Numba kernel inside the DALI graph.

torchvision (``transforms.ColorJitter`` over ``_functional_tensor``) draws a random order of the four adjustments
and one factor for each enabled one, then applies them in that order, each a ``_blend`` that clamps to the
image's range and, for uint8 images, truncates back to uint8 after every step:

    brightness   blend(img, 0, f)
    contrast     blend(img, mean(gray(img)), f)          gray = uint8(0.2989 r + 0.587 g + 0.114 b)
    saturation   blend(img, gray(img), f)
    hue          hsv = rgb2hsv(img / 255); h = (h + f) mod 1; uint8(hsv2rgb(hsv) * 255.999)

The order and the factors are drawn on the host from the sample's stream; the kernel does the pixel work in
float32 as torch does. Contrast needs the mean of the image *as it is when contrast comes*, so the kernel makes
two passes: one that applies the steps before contrast to every pixel and sums their grey values, and one that
applies every step. On the GPU the two passes run in one block per sample (a shared-memory reduction in between).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda as _numba_cuda
from numba import float64
from nvidia.dali.pipeline import do_not_convert

from stallfree.transforms.kernels.color import (
    BRIGHTNESS,
    CONTRAST,
    HUE,
    SATURATION,
    apply_steps,
    contrast_at,
    gray,
    jitter,
)
from stallfree.transforms.numba.cpu import compile_cpu
from stallfree.transforms.numba.dali import numba_node
from stallfree.transforms.numba.kernel import KernelTransform, kernel
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["ColorJitter", "RandomChannelPermutation", "RandomPhotometricDistort", "jitter_cuda_function",
           "jitter_function", "jitter_node"]

cuda: Any = _numba_cuda  # a module global, so that the CUDA simulator can stand in for it
GPU_THREADS = 256  # one block per sample; the reduction's shared array has this many slots


def _check_input(
    value: float | Sequence[float], name: str, center: float = 1.0, bound: tuple[float, float] = (0, math.inf),
    clip_first_on_zero: bool = True,
) -> tuple[float, float] | None:
    """Torchvision's ``ColorJitter._check_input``: a range, or ``None`` where the adjustment does nothing."""
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        v = float(value)  # type: ignore[arg-type]
        if v < 0:
            raise ValueError(f"ColorJitter: if {name} is a single number, it must be non negative, got {value}")
        lo, hi = center - v, center + v
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise TypeError(f"ColorJitter: {name} should be a single number or a list/tuple with length 2, got {value!r}")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"ColorJitter: {name} values should be between {bound}, but got {[lo, hi]}")
    return None if lo == hi == center else (lo, hi)


@functools.cache  # the same function each time: it keys numba_operator's cache of constructed operators
def jitter_function(integral: bool) -> Any:
    """The per-sample CPU run function ``run(out, image, order, factors)`` (uint8 images if ``integral``)."""
    bound = np.float32(255.0 if integral else 1.0)

    def run(out: Any, image: Any, order: Any, factors: Any) -> None:
        jitter(out, image, order, factors, bound, integral)

    return run


def jitter_cuda_function(integral: bool) -> Any:
    """The CUDA run function: one block of :data:`GPU_THREADS` threads per sample, two passes around a reduction."""
    bound = np.float32(255.0 if integral else 1.0)

    def run(out: Any, image: Any, order: Any, factors: Any) -> None:
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        height, width = image.shape[0], image.shape[1]
        n = height * width
        kc = contrast_at(order)
        partial = cuda.shared.array(GPU_THREADS, float64)
        total = 0.0
        if kc >= 0:
            for idx in range(tid, n, nthreads):
                y, x = idx // width, idx % width
                r, g, b = apply_steps(
                    np.float32(image[y, x, 0]), np.float32(image[y, x, 1]), np.float32(image[y, x, 2]),
                    order, factors, kc, np.float32(0.0), bound, integral,
                )
                total += gray(r, g, b, integral)
        partial[tid] = total
        cuda.syncthreads()
        stride = nthreads // 2
        while stride > 0:
            if tid < stride:
                partial[tid] += partial[tid + stride]
            cuda.syncthreads()
            stride //= 2
        mean = np.float32(partial[0] / n)
        for idx in range(tid, n, nthreads):
            y, x = idx // width, idx % width
            r, g, b = apply_steps(
                np.float32(image[y, x, 0]), np.float32(image[y, x, 1]), np.float32(image[y, x, 2]),
                order, factors, 4, mean, bound, integral,
            )
            out[y, x, 0], out[y, x, 1], out[y, x, 2] = r, g, b

    return run


@do_not_convert
def jitter_node(image: Any, order: Any, factors: Any, state: GraphState) -> Any:
    """The ColorJitter kernel as a DALI node: the steps ``order`` (ids, -1 for none) with ``factors`` (b, c, s, h)."""
    integral = state.dtype == "uint8"
    image_dtype = np.uint8 if integral else np.float32
    if state.device == "gpu":
        return numba_node(
            jitter_cuda_function(integral), image, [order, factors], image_dtype=image_dtype,
            param_dtypes=[np.int32, np.float64], device="gpu", blocks=(1, 1, 1), threads_per_block=(GPU_THREADS, 1, 1),
        )
    from stallfree.transforms.kernels.entries import JITTER_ENTRIES  # cached on disk: no compile per process

    return numba_node(
        jitter_function(integral), image, [order, factors], image_dtype=image_dtype,
        param_dtypes=[np.int32, np.float64], device="cpu", entries=JITTER_ENTRIES[integral],
    )


_COMPILED: dict[bool, Any] = {}


def _compiled(integral: bool) -> Any:
    if integral not in _COMPILED:
        image_dtype = np.uint8 if integral else np.float32
        _COMPILED[integral] = compile_cpu("ColorJitter", jitter_function(integral), image_dtype, [np.int32, np.float64])
    return _COMPILED[integral]


@dataclass(frozen=True)
class ColorJitter(Transform):
    """Randomly change brightness, contrast, saturation and hue, in a random order (torchvision's ColorJitter).

    Args:
        brightness: ``b`` or ``(min, max)``; a number means ``[max(0, 1 - b), 1 + b]``. 0 disables it.
        contrast: as ``brightness``.
        saturation: as ``brightness``.
        hue: ``h`` in [0, 0.5] meaning ``[-h, h]``, or ``(min, max)`` within [-0.5, 0.5].

    Raises:
        ValueError: a negative number, or a range outside its bounds (torchvision's messages).
        TypeError: an argument that is neither a number nor a pair.
    """

    brightness: float | Sequence[float] = 0
    contrast: float | Sequence[float] = 0
    saturation: float | Sequence[float] = 0
    hue: float | Sequence[float] = 0
    params = {"order": np.int32, "factors": np.float64}  # order: 4 step ids (-1: disabled); factors: b, c, s, h

    def __post_init__(self) -> None:
        self.ranges()

    def ranges(self) -> tuple[tuple[float, float] | None, ...]:
        """The checked ``(min, max)`` of brightness, contrast, saturation and hue (``None``: disabled)."""
        return (
            _check_input(self.brightness, "brightness"),
            _check_input(self.contrast, "contrast"),
            _check_input(self.saturation, "saturation"),
            _check_input(self.hue, "hue", center=0, bound=(-0.5, 0.5), clip_first_on_zero=False),
        )

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        ranges = self.ranges()
        order = rng.permutation(4)  # torch.randperm(4), then the factors in b, c, s, h order
        factors = [0.0 if r is None else rng.uniform(r[0], r[1]) for r in ranges]
        ids = [i if ranges[i] is not None else -1 for i in order]
        return {"order": np.array(ids, np.int32), "factors": np.array(factors, np.float64)}, size

    def is_identity(self) -> bool:
        """Every factor disabled (``ColorJitter()``, ``brightness=(1, 1)``, ...): torchvision's no-op."""
        return all(r is None for r in self.ranges())

    def prepare(self, state: GraphState) -> None:
        """Load the CPU kernel's cached entry points now, compiling them once per installation (``build`` does too)."""
        if not self.is_identity() and state.device == "cpu":
            from stallfree.transforms.kernels.entries import JITTER_ENTRIES  # noqa: F401  (loads or compiles the cache)

    @do_not_convert  # DALI's AutoGraph (enable_conditionals=True) must not rewrite the functions handed to Numba
    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        if self.is_identity():  # the compiler leaves it out; kept for a direct call
            return image, state
        return jitter_node(image, params["order"], params["factors"], state), state

    def apply(self, image: np.ndarray, order: np.ndarray, factors: np.ndarray) -> np.ndarray:
        """Run the CPU kernel outside DALI on one HWC image with explicit parameters (as :meth:`draw` makes them)."""
        image = np.ascontiguousarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype not in (np.uint8, np.float32):
            raise ValueError(f"ColorJitter: needs an HWC RGB uint8 or float32 image, got {image.dtype} {image.shape}")
        out = np.empty_like(image)
        _compiled(image.dtype == np.uint8)(out, image, np.asarray(order, np.int32), np.asarray(factors, np.float64))
        return out


@kernel(name="RandomPhotometricDistort.permute")
def _permute(out: Any, image: Any, y: int, x: int, perm: Any) -> None:
    for c in range(image.shape[2]):  # perm: (apply, then the source channel of each output channel)
        out[y, x, c] = image[y, x, perm[1 + c]] if perm[0] != 0 else image[y, x, c]


def _pair(name: str, arg: str, value: Sequence[float], bound: tuple[float, float]) -> tuple[float, float]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name}: {arg} should be a (min, max) pair, got {value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"{name}: {arg} values should be between {bound}, but got {[lo, hi]}")
    return lo, hi


@dataclass(frozen=True)
class RandomPhotometricDistort(Transform):
    """SSD's photometric distortion (torchvision v2's ``RandomPhotometricDistort``), on RGB images.

    Each of brightness, contrast, saturation and hue is applied with probability ``p``, its factor uniform in its
    range; contrast comes first or last (even odds); then, with probability ``p``, the channels are permuted at
    random. The four adjustments are :class:`ColorJitter`'s kernel (torchvision's v1 arithmetic, which v2 computes
    with fused multiply-adds: values differ by a level at times), the permutation a kernel of its own.
    """

    brightness: Sequence[float] = (0.875, 1.125)
    contrast: Sequence[float] = (0.5, 1.5)
    saturation: Sequence[float] = (0.5, 1.5)
    hue: Sequence[float] = (-0.05, 0.05)
    p: float = 0.5
    params = {"order": np.int32, "factors": np.float64, "perm": np.int32}  # perm: (apply, 3 source channels)

    def __post_init__(self) -> None:
        self.ranges()
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomPhotometricDistort: p must be in [0, 1], got {self.p}")

    def ranges(self) -> tuple[tuple[float, float], ...]:
        """The checked ``(min, max)`` of brightness, contrast, saturation and hue."""
        name, positive = "RandomPhotometricDistort", (0.0, math.inf)
        return (_pair(name, "brightness", self.brightness, positive), _pair(name, "contrast", self.contrast, positive),
                _pair(name, "saturation", self.saturation, positive), _pair(name, "hue", self.hue, (-0.5, 0.5)))

    def is_identity(self) -> bool:
        return self.p == 0

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        # torchvision's make_params: per adjustment rand(1) < p then its factor, contrast_before, rand(1) < p, randperm
        factors = [rng.uniform(lo, hi) if rng.random() < self.p else None for lo, hi in self.ranges()]
        contrast_before = rng.random() < 0.5
        perm = [1, *rng.permutation(3)] if rng.random() < self.p else [0, 0, 1, 2]
        steps = [BRIGHTNESS, CONTRAST, SATURATION, HUE] if contrast_before else [BRIGHTNESS, SATURATION, HUE, CONTRAST]
        order = [k if factors[k] is not None else -1 for k in steps]
        values = [0.0 if f is None else f for f in factors]
        params = {"order": np.array(order, np.int32), "factors": np.array(values, np.float64),
                  "perm": np.array(perm, np.int32)}
        return params, size

    def prepare(self, state: GraphState) -> None:
        ColorJitter(brightness=1.0).prepare(state)
        _permute.compile(np.dtype(state.dtype).type, [np.int32])

    @do_not_convert
    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        jittered = jitter_node(image, params["order"], params["factors"], state)
        return _permute.node(jittered, [params["perm"]], [np.int32], state), state

    def apply(self, image: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
        """Run the step's CPU kernels outside DALI on one HWC RGB image, with parameters as :meth:`draw` makes them."""
        jittered = ColorJitter(brightness=1.0).apply(image, params["order"], params["factors"])
        return _permute(jittered, np.asarray(params["perm"], np.int32))


@dataclass(frozen=True)
class RandomChannelPermutation(KernelTransform):
    """Permute the three channels at random, every permutation equally likely (torchvision v2's, ``randperm(3)``)."""

    params = {"perm": np.int32}  # (apply, the source channel of each output channel)
    kernel = _permute

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        return {"perm": [1, *rng.permutation(3)]}
