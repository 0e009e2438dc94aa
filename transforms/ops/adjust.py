"""torchvision's image adjustments (invert, autocontrast, equalize, sharpness) as graph steps.

Each step draws torchvision's random parameters from the sample's stream on the host and applies them in the graph,
with the arithmetic of torchvision's tensor path (``_functional_tensor`` for the v1 classes, ``v2.functional``
for the v2 ones, where the two differ), uint8 before ``Normalize`` and float32 on [0, 1] after ``ToTensor``:

    RandomInvert            bound - v                                                      exact
    RandomAutocontrast      per channel (v - min) * (bound / (max - min))     (v1)          exact
                            per channel (v - min) / ((max - min) * (1 / bound))  (v2)
    RandomEqualize          PIL's lookup table from each channel's histogram (uint8 only)  exact
    RandomAdjustSharpness   blend with the 3x3 [1 1 1; 1 5 1; 1 1 1] / 13 blur              exact (uint8)

A statistic of the whole image (autocontrast's minimum and maximum, equalize's histogram) is computed by DALI operators,
or by a kernel of its own, before the pixel kernel, and handed to it as a per-sample input.
:data:`stallfree.transforms.translation.photometric.TRANSLATORS` turns torchvision's instances of these classes into
them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from nvidia.dali.pipeline import do_not_convert

from stallfree.transforms.numba.kernel import Kernel, KernelTransform, kernel
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size

__all__ = [
    "RandomAdjustSharpness",
    "RandomAutocontrast",
    "RandomEqualize",
    "RandomInvert",
]

Variant = Literal["v1", "v2"]
_F0, _F1 = np.float32(0.0), np.float32(1.0)
_A, _B = np.float32(1.0 / 13.0), np.float32(5.0 / 13.0)  # the sharpness blur's weights, as torch's float32 kernel


def _per_dtype(make: Callable[[bool], Callable[..., None]], name: str) -> dict[str, Kernel]:
    """A uint8 and a float32 kernel from one factory (``integral`` is a compile-time constant in each)."""
    return {"uint8": kernel(make(True), name=f"{name}[uint8]"), "float32": kernel(make(False), name=f"{name}[float32]")}


def _probability(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}: p must be in [0, 1], got {p}")


def _variant(name: str, variant: str) -> None:
    if variant not in ("v1", "v2"):
        raise ValueError(f"{name}: variant must be 'v1' or 'v2' (torchvision's API whose arithmetic to follow), "
                         f"got {variant!r}")


class _StatisticKernel(KernelTransform):
    """A kernel step that also takes per-sample statistics of the image, computed in the graph.

    ``params`` are drawn on the host; ``statistics`` (name to dtype) are made by :meth:`graph_statistics` from the
    image node (and the drawn parameters) and, outside DALI, by :meth:`host_statistics` from the array, so
    :meth:`apply` runs the same kernel.
    """

    statistics: ClassVar[Mapping[str, type]] = {}

    def graph_statistics(self, image: Any, params: Mapping[str, Any], state: GraphState) -> dict[str, Any]:
        raise NotImplementedError

    def host_statistics(self, image: np.ndarray, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _dtypes(self) -> dict[str, type]:
        return {**self.params, **self.statistics}

    @do_not_convert  # DALI's AutoGraph (enable_conditionals=True) must not rewrite the functions handed to Numba
    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        self.check(state)
        kern = self.kernel_for(state)
        values = {**params, **self.graph_statistics(image, params, state)}
        dtypes = self._dtypes()
        names = self._names(kern)
        return kern.node(image, [values[n] for n in names], [dtypes[n] for n in names], state), state

    def prepare(self, state: GraphState) -> None:
        self.check(state)
        kern = self.kernel_for(state)
        dtypes = self._dtypes()
        kern.compile(np.dtype(state.dtype).type, [dtypes[n] for n in self._names(kern)])

    def _names(self, kern: Kernel) -> tuple[str, ...]:
        if set(kern.param_names) != set(self._dtypes()):
            raise ValueError(f"{type(self).__name__}: kernel {kern.name!r} takes {list(kern.param_names)}, "
                             f"the step gives {sorted(self._dtypes())}")
        return kern.param_names

    def apply(self, image: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
        """Run the step's CPU kernel outside DALI on one HWC image, with parameters as :meth:`draw` returns them."""
        image = np.ascontiguousarray(image)
        if image.dtype not in (np.uint8, np.float32) or image.ndim != 3:
            raise ValueError(f"{type(self).__name__}: needs an HWC uint8 or float32 image, got {image.dtype} "
                             f"{image.shape}")
        state = GraphState("cpu", "uint8" if image.dtype == np.uint8 else "float32")
        self.check(state)
        kern = self.kernel_for(state)
        values = {**params, **self.host_statistics(image, params)}
        dtypes = self._dtypes()
        return kern(image, *[np.asarray(values[n], dtypes[n]) for n in self._names(kern)])


# --- RandomInvert -------------------------------------------------------------------------------------------------


def _make_invert(integral: bool) -> Callable[..., None]:
    bound: Any = 255 if integral else _F1

    def invert(out: Any, image: Any, y: int, x: int, apply: Any) -> None:
        for c in range(image.shape[2]):
            v = image[y, x, c]
            out[y, x, c] = bound - v if apply[0] != 0 else v

    return invert


_INVERT = _per_dtype(_make_invert, "RandomInvert")


@dataclass(frozen=True)
class RandomInvert(KernelTransform):
    """With probability ``p``, ``bound - v`` for every value (255 on uint8 images, 1 on float ones)."""

    p: float = 0.5
    params = {"apply": np.int32}

    def __post_init__(self) -> None:
        _probability("RandomInvert", self.p)

    def is_identity(self) -> bool:
        return self.p == 0

    def kernel_for(self, state: GraphState) -> Kernel:
        return _INVERT[state.dtype]

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        return {"apply": int(rng.random() < self.p)}


# --- RandomAutocontrast -------------------------------------------------------------------------------------------


def _make_autocontrast(integral: bool) -> Callable[..., None]:
    bound = np.float32(255.0 if integral else 1.0)
    inverse = np.float32(1.0 / 255.0 if integral else 1.0)  # v2's mul_(1.0 / bound), a Python float cast to float32

    def autocontrast(out: Any, image: Any, y: int, x: int, config: Any, low: Any, high: Any) -> None:
        for c in range(image.shape[2]):
            v = image[y, x, c]
            if config[0] == 0:
                out[y, x, c] = v
                continue
            lo, hi, f = low[c], high[c], np.float32(v)
            if config[1] == 1:  # v1: (img - minimum) * (bound / (maximum - minimum)), non-finite scale -> (0, 1);
                # torch divides a number by a tensor as reciprocal() * number: two float32 roundings
                r = (f - lo) * ((_F1 / (hi - lo)) * bound) if hi != lo else f
            else:  # v2: (img - minimum) / ((maximum - minimum) * (1 / bound)), equal -> (0, 1)
                r = (f - lo) / ((hi - lo) * inverse) if hi != lo else f
            r = min(max(r, _F0), bound)
            out[y, x, c] = np.float32(math.floor(r)) if integral else r

    return autocontrast


_AUTOCONTRAST = _per_dtype(_make_autocontrast, "RandomAutocontrast")


@dataclass(frozen=True)
class RandomAutocontrast(_StatisticKernel):
    """With probability ``p``, stretch each channel's values to span the whole range (torchvision's autocontrast).

    The minimum and maximum of each channel are taken by DALI's reductions in the graph. ``variant`` picks the
    arithmetic of torchvision's v1 or v2 function (they round differently); a constant channel is left as it is.
    """

    p: float = 0.5
    variant: Variant = "v1"
    params = {"config": np.int32}  # (apply, 1 for v1 or 2 for v2)
    statistics = {"low": np.float32, "high": np.float32}  # per channel

    def __post_init__(self) -> None:
        _probability("RandomAutocontrast", self.p)
        _variant("RandomAutocontrast", self.variant)

    def is_identity(self) -> bool:
        return self.p == 0

    def kernel_for(self, state: GraphState) -> Kernel:
        return _AUTOCONTRAST[state.dtype]

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        return {"config": [int(rng.random() < self.p), 1 if self.variant == "v1" else 2]}

    def graph_statistics(self, image: Any, params: Mapping[str, Any], state: GraphState) -> dict[str, Any]:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        low = fn.reductions.min(image, axes=[0, 1], device=state.device)
        high = fn.reductions.max(image, axes=[0, 1], device=state.device)
        return {"low": fn.cast(low, dtype=types.FLOAT), "high": fn.cast(high, dtype=types.FLOAT)}

    def host_statistics(self, image: np.ndarray, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {"low": image.min((0, 1)).astype(np.float32), "high": image.max((0, 1)).astype(np.float32)}


# --- RandomEqualize -----------------------------------------------------------------------------------------------


@kernel(name="RandomEqualize.table")
def _equalize_table(out: Any, carrier: Any, y: int, x: int, flat: Any, apply: Any) -> None:
    # out is (1, 256, C) float32: each channel's lookup table, made at pixel (0, 0) alone from the whole image
    # (flat, HWC order), with out holding the histogram first (counts are exact in float32 up to 2**24 pixels).
    if y != 0 or x != 0:
        return
    channels = out.shape[2]
    n = flat.shape[0] // channels
    for c in range(channels):
        for k in range(256):
            out[0, k, c] = 0
        if apply[0] != 0:
            for i in range(n):
                out[0, flat[i * channels + c], c] += 1
        last = 255
        while last > 0 and out[0, last, c] == 0:
            last -= 1
        step = (n - int(out[0, last, c])) // 255  # the pixels below the largest value present, over 255 (PIL's)
        if apply[0] == 0 or step == 0:  # torchvision keeps a channel with step == 0 as it is
            for k in range(256):
                out[0, k, c] = k
            continue
        total = 0
        for k in range(256):  # lut[k] = (cumsum[k - 1] + step // 2) // step, lut[0] = 0, clamped to 255
            count = int(out[0, k, c])
            out[0, k, c] = min((total + step // 2) // step, 255)
            total += count


@kernel(name="RandomEqualize")
def _equalize(out: Any, image: Any, y: int, x: int, apply: Any, table: Any) -> None:
    channels = image.shape[2]
    for c in range(channels):
        v = image[y, x, c]
        out[y, x, c] = table[int(v) * channels + c] if apply[0] != 0 else v


@dataclass(frozen=True)
class RandomEqualize(_StatisticKernel):
    """With probability ``p``, equalize each channel's histogram with PIL's lookup table (uint8 images).

    torchvision's v1 and v2 functions compute the same table: ``lut[k] = (cumsum(hist)[k - 1] + step // 2) // step``
    with ``step = (pixels below the channel's largest value) // 255``; a channel with ``step == 0`` is kept.
    """

    p: float = 0.5
    params = {"apply": np.int32}
    statistics = {"table": np.float32}  # (256 * C,): each channel's table, interleaved as the pixels are
    kernel = _equalize

    def __post_init__(self) -> None:
        _probability("RandomEqualize", self.p)

    def is_identity(self) -> bool:
        return self.p == 0

    def check(self, state: GraphState) -> None:
        if state.dtype != "uint8":
            raise ValueError("RandomEqualize: only uint8 images are supported (as torchvision's v1); put it before "
                             "ToTensor / Normalize")

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        return {"apply": int(rng.random() < self.p)}

    @do_not_convert
    def graph_statistics(self, image: Any, params: Mapping[str, Any], state: GraphState) -> dict[str, Any]:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        # A (1, 256, C) float32 carrier of the image's channel count: the table kernel's output takes its shape.
        corner = fn.slice(image, start=[0, 0], shape=[1, 1], axis_names="HW", device=state.device)
        carrier = fn.pad(fn.cast(corner, dtype=types.FLOAT), axis_names="W", shape=[256], device=state.device)
        flat = fn.reshape(image, shape=[-1], device=state.device)
        table = _equalize_table.node(carrier, [flat, params["apply"]], [np.uint8, np.int32],
                                     GraphState(state.device, "float32"))
        return {"table": fn.reshape(table, shape=[-1], device=state.device)}

    def host_statistics(self, image: np.ndarray, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        carrier = np.zeros((1, 256, image.shape[2]), np.float32)
        return {"table": _equalize_table(carrier, image.reshape(-1), np.asarray(params["apply"], np.int32)).reshape(-1)}

    def prepare(self, state: GraphState) -> None:
        super().prepare(state)
        _equalize_table.compile(np.float32, [np.uint8, np.int32])


# --- RandomAdjustSharpness ----------------------------------------------------------------------------------------


def _make_sharpness(integral: bool) -> Callable[..., None]:
    bound = np.float32(255.0 if integral else 1.0)

    def sharpness(out: Any, image: Any, y: int, x: int, factor: Any, config: Any) -> None:
        # factor: (ratio, 1 - ratio) as float32, each cast from the double torchvision computes; config: (apply,
        # 1 for v1 or 2 for v2)
        height, width = image.shape[0], image.shape[1]
        border = y == 0 or x == 0 or y == height - 1 or x == width - 1
        for c in range(image.shape[2]):
            v = image[y, x, c]
            if config[0] == 0 or height <= 2 or width <= 2 or (border and config[1] == 2):
                out[y, x, c] = v
                continue
            f = np.float32(v)
            d = f  # v1 blends the border with itself (which a truncation can move by one level)
            if not border:
                s = _F0
                for dy in range(-1, 2):
                    for dx in range(-1, 2):
                        if dy != 0 or dx != 0:
                            s += np.float32(image[y + dy, x + dx, c])
                d = _A * s + _B * f
                if integral:
                    d = np.float32(math.floor(d + np.float32(0.5)))  # never a tie: the exact value is k / 13
            if config[1] == 1:  # v1's _blend: ratio * img + (1 - ratio) * degenerate, three float32 roundings
                r = factor[0] * f + factor[1] * d
            else:  # v2: img + (1 - ratio) * (degenerate - img), one rounding (torch's fused multiply-add)
                r = np.float32(np.float64(f) + np.float64(factor[1]) * np.float64(d - f))
            r = min(max(r, _F0), bound)
            out[y, x, c] = np.float32(math.floor(r)) if integral else r

    return sharpness


_SHARPNESS = _per_dtype(_make_sharpness, "RandomAdjustSharpness")


@dataclass(frozen=True)
class RandomAdjustSharpness(KernelTransform):
    """With probability ``p``, blend with the 3x3 smoothing of the image by ``sharpness_factor`` (torchvision's).

    ``sharpness_factor`` 0 gives the smoothed image, 1 the original, 2 twice as sharp. The smoothing is
    ``[1 1 1; 1 5 1; 1 1 1] / 13`` inside the image (rounded on uint8 images) and the image itself on its border.
    ``variant`` picks the arithmetic of torchvision's v1 or v2 function (v2 leaves the border as it is).
    """

    sharpness_factor: float
    p: float = 0.5
    variant: Variant = "v1"
    params = {"factor": np.float32, "config": np.int32}

    def __post_init__(self) -> None:
        if not self.sharpness_factor >= 0:
            raise ValueError(f"RandomAdjustSharpness: sharpness_factor should be non-negative, got "
                             f"{self.sharpness_factor}")
        _probability("RandomAdjustSharpness", self.p)
        _variant("RandomAdjustSharpness", self.variant)

    def is_identity(self) -> bool:
        return self.p == 0

    def kernel_for(self, state: GraphState) -> Kernel:
        return _SHARPNESS[state.dtype]

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        ratio = float(self.sharpness_factor)
        apply = int(rng.random() < self.p)
        return {"factor": [ratio, 1.0 - ratio], "config": [apply, 1 if self.variant == "v1" else 2]}
