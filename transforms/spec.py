"""The augmentation spec: torchvision's names and semantics, each step able to put itself into a DALI graph.

A step does two things. On the host, :meth:`Transform.draw` turns one sample's random stream and its current
``(height, width)`` into explicit per-sample parameters (a crop window, a flip bit), exactly as torchvision
draws them. In the graph, :meth:`Transform.build` applies those parameters with DALI operators, which receive
them as per-sample inputs. Randomness therefore never lives inside DALI, and a sample's augmentation depends on
``(seed, epoch, sample)`` alone (DESIGN.md, "Augmentation randomness is keyed by sample").

Images flow through the graph as HWC; uint8 until :class:`Normalize`, float32 after it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from stallfree.transforms.random import SampleRandom

__all__ = [
    "CenterCrop",
    "GraphState",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RandomVerticalFlip",
    "Resize",
    "Transform",
]

Size = tuple[int, int]  # (height, width), as torchvision orders sizes
Interpolation = Literal["bilinear", "bicubic", "nearest", "box", "hamming", "lanczos"]
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "box", "hamming", "lanczos")
_PIL_FILTERS = {"bilinear": 0, "bicubic": 1, "box": 2, "hamming": 3, "lanczos": 4}  # resample_kernels.FILTERS


def size_pair(name: str, size: int | Sequence[int]) -> Size:
    # No annotated locals here: DALI's AutoGraph (conditional graphs) cannot rewrite them.
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        height = width = int(size)
    elif isinstance(size, Sequence) and len(size) in (1, 2) and all(isinstance(s, (int, np.integer)) for s in size):
        height, width = int(size[0]), int(size[-1])
    else:
        raise ValueError(f"{name}: size must be an int or a (height, width) pair of ints, got {size!r}")
    if min(height, width) <= 0:
        raise ValueError(f"{name}: size must be positive, got {size!r}")
    return height, width


def _range_pair(name: str, arg: str, value: Sequence[float], low: float = 0.0) -> tuple[float, float]:
    if not isinstance(value, Sequence) or len(value) != 2:
        raise ValueError(f"{name}: {arg} must be a (min, max) pair, got {value!r}")
    a, b = float(value[0]), float(value[1])
    if not (low <= a <= b) or not math.isfinite(b):
        raise ValueError(f"{name}: {arg} must satisfy {low} <= min <= max, got {value!r}")
    return a, b


@dataclass(frozen=True)
class GraphState:
    """What the graph compiler knows about the image between steps."""

    device: Literal["cpu", "gpu"]
    dtype: Literal["uint8", "float32"] = "uint8"


def size_input(size: Size) -> np.ndarray:
    """A step's output ``(height, width)`` as a per-sample graph input: the shape of an empty uint8 array.

    A shape, not values, because DALI sizes a Numba operator's output from its input shapes alone; carried this
    way, one compiled resampler serves every size (``transforms/kernels/resample_node.py``).
    """
    return np.empty((size[0], size[1], 0), np.uint8)


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


class Transform:
    """One step of the spec. Subclasses are frozen dataclasses that check their arguments in ``__post_init__``."""

    #: Names of the per-sample parameters :meth:`draw` returns and :meth:`build` reads, with their NumPy dtypes.
    params: Mapping[str, type] = {}
    #: Whether the step can change the image size (then :meth:`fixed_size` says whether it fixes it).
    changes_size: bool = False
    #: Whether the step uses DALI's conditional execution (the graph is then defined with enable_conditionals).
    conditionals: bool = False

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        """This sample's parameters, given its current ``(height, width)``, and its ``(height, width)`` after."""
        return {}, size

    def prepare(self, state: GraphState) -> None:
        """Check the step against the image it will get and do costly set-up (kernel compilation) now.

        Called when the spec is checked, before any graph is built, so that a step that cannot run fails at
        ``Loader(...)`` rather than at the first batch.
        """

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        """Apply the step to a DALI node, with ``params`` as DALI nodes of per-sample values."""
        raise NotImplementedError

    def fixed_size(self) -> Size | None:
        """The output ``(height, width)`` if this step makes every sample the same size, else ``None``."""
        return None

    def size_after(self, size: Size | None) -> Size | None:
        """The size every sample has after this step, given the size every sample has before (``None``: it varies)."""
        fixed = self.fixed_size()
        if fixed is not None:
            return fixed
        return None if self.changes_size else size

    def is_identity(self) -> bool:
        """Whether the step leaves every image as it is, whatever it draws (``p=0``, a ``ColorJitter()``).

        The compiler drops such a step, as torchvision never changes the image there: it draws nothing, feeds the
        graph nothing and builds nothing, so the inputs fed always equal the inputs the graph reads.
        """
        return False


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
