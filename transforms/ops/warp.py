"""``RandomRotation``, ``RandomAffine`` and ``RandomPerspective`` with torchvision's semantics, equal to its PIL output.

The host draws each sample's parameters from its keyed stream in torchvision's order (the angle, the translation, the
scale, the shears; the four corners' offsets) and turns them into the coefficients PIL's ``Image.transform`` takes, by
the same arithmetic as torchvision and Pillow (``Image.rotate``'s rounded matrix and its ``expand`` size, torchvision's
``_get_inverse_affine_matrix`` and ``_get_perspective_coeffs``). The graph samples the image with them by
:mod:`~stallfree.transforms.kernels.warp`, PIL's engines, so the pixels equal torchvision's on PIL images
(``tests/transforms/ops/test_warp.py``; for perspective, to the float32 rounding of the least-squares coefficients).

On uint8 images: torchvision's float-tensor path (``grid_sample``) is another computation, so a step placed after
``Normalize`` is refused with the fix. The GPU graph warps with DALI's ``warp_perspective`` and the same
coefficients, equal to PIL's but at the image's edges (:func:`dali_warp`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stallfree.transforms.kernels.warp import AFFINE, BICUBIC, BILINEAR, NEAREST, PERSPECTIVE, entries, warp
from stallfree.transforms.ops.geometry import Fill, fill_per_channel
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform, size_input

__all__ = ["RandomAffine", "RandomPerspective", "RandomRotation", "affine_matrix", "perspective_coefficients",
           "rotation_matrix"]

WarpInterpolation = Literal["nearest", "bilinear", "bicubic"]
_FILTERS = {"nearest": NEAREST, "bilinear": BILINEAR, "bicubic": BICUBIC}
_IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)  # a0 .. a7 and the matrix's last 1


def _range(name: str, arg: str, value: float | Sequence[float], sizes: tuple[int, ...] = (2,)) -> tuple[float, ...]:
    """Torchvision's ``_setup_angle``: a number ``d`` is ``(-d, d)``; else a sequence of one of ``sizes`` lengths."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name}: if {arg} is a single number, it must be positive, got {value}")
        return -float(value), float(value)
    if isinstance(value, Sequence) and len(value) in sizes and all(isinstance(v, numbers.Real) for v in value):
        return tuple(float(v) for v in value)
    raise ValueError(f"{name}: {arg} must be a number or a sequence of length {' or '.join(map(str, sizes))}, "
                     f"got {value!r}")


def _interpolation(name: str, interpolation: str) -> None:
    if interpolation not in _FILTERS:
        raise ValueError(f"{name}: interpolation must be one of {tuple(_FILTERS)} (PIL's transform filters), "
                         f"got {interpolation!r}")


def rotation_matrix(
    angle: float, height: int, width: int, expand: bool, center: Sequence[float] | None
) -> tuple[list[float], Size]:
    """PIL's ``Image.rotate`` coefficients (output to source) and output ``(height, width)``.

    Its fast paths (a whole number of half or quarter turns about the centre) are pixel copies; here they are the
    matrices that copy the same pixels through the nearest-neighbour engine.
    """
    angle = angle % 360.0
    if center is None:
        if angle == 0:
            return [1.0, 0.0, 0.0, 0.0, 1.0, 0.0], (height, width)
        if angle == 180:
            return [-1.0, 0.0, float(width), 0.0, -1.0, float(height)], (height, width)
        if angle == 90 and (expand or width == height):
            return [0.0, -1.0, float(width), 1.0, 0.0, 0.0], (width, height)
        if angle == 270 and (expand or width == height):
            return [0.0, 1.0, 0.0, -1.0, 0.0, float(height)], (width, height)
    cx, cy = (width / 2, height / 2) if center is None else (center[0], center[1])
    theta = -math.radians(angle)
    m = [round(math.cos(theta), 15), round(math.sin(theta), 15), 0.0,
         round(-math.sin(theta), 15), round(math.cos(theta), 15), 0.0]

    def apply(x: float, y: float) -> tuple[float, float]:
        return m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]

    m[2], m[5] = apply(-cx - 0, -cy - 0)
    m[2] += cx
    m[5] += cy
    if expand:
        corners = [apply(x, y) for x, y in ((0, 0), (width, 0), (width, height), (0, height))]
        xs, ys = [c[0] for c in corners], [c[1] for c in corners]
        new_w = math.ceil(max(xs)) - math.floor(min(xs))
        new_h = math.ceil(max(ys)) - math.floor(min(ys))
        m[2], m[5] = apply(-(new_w - width) / 2.0, -(new_h - height) / 2.0)
        width, height = new_w, new_h
    return m, (height, width)


def affine_matrix(
    center: Sequence[float], angle: float, translate: Sequence[float], scale: float, shear: Sequence[float]
) -> list[float]:
    """Torchvision's ``_get_inverse_affine_matrix``: output to source, rotation about ``center`` then shears."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [x / scale for x in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def perspective_coefficients(start: Sequence[Sequence[int]], end: Sequence[Sequence[int]]) -> list[float]:
    """Torchvision's ``_get_perspective_coeffs``: the 8 coefficients mapping ``end`` to ``start``, as float32."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(end, start, strict=True):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        rhs.extend([u, v])
    solution = np.linalg.lstsq(np.array(rows, np.float64), np.array(rhs, np.float64), rcond=None)[0]
    return [float(v) for v in solution.astype(np.float32)]


class _Warp(Transform):
    """A step whose pixels are PIL's ``Image.transform`` of per-sample coefficients: the graph's part."""

    params = {"size": np.uint8, "warp": np.float64}  # see size_input; [method, filter, a0..a7, 1, fill r, g, b]
    interpolation: str
    fill: Fill

    def _params(self, method: int, a: Sequence[float], size: Size, kind: int | None = None) -> dict[str, Any]:
        coefficients = [*a, *_IDENTITY[len(a):]]
        fill = fill_per_channel(type(self).__name__, self.fill)
        kind = _FILTERS[self.interpolation] if kind is None else kind
        values = np.array([method, kind, *coefficients, *(int(v) for v in fill)], np.float64)
        return {"size": size_input(size), "warp": values}

    def prepare(self, state: GraphState) -> None:
        name = type(self).__name__
        if state.dtype != "uint8":
            raise ValueError(f"{name} runs on uint8 images, as torchvision's on PIL images; put it before ToTensor "
                             "and Normalize")
        if not all(0 <= v < 256 for v in fill_per_channel(name, self.fill)):
            raise ValueError(f"{name}: fill {self.fill!r} is outside a uint8 image's 0..255")
        entries()  # load (or compile, once per installation) the operator's entry points now, not at the first batch

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        if state.device != "cpu":
            fill = fill_per_channel(type(self).__name__, self.fill)
            return dali_warp(image, params, self.interpolation, fill, state.device), state
        from stallfree.transforms.numba.dali import numba_operator

        operator = numba_operator(_run, _setup, in_types=[np.uint8, np.uint8, np.float64], ins_ndim=[3, 3, 1],
                                  out_type=np.uint8, entries=entries())
        return operator(params["size"], image, params["warp"]), state


def dali_warp(image: Any, params: Mapping[str, Any], interpolation: str, fill: Sequence[float], device: str) -> Any:
    """The same warp by DALI's ``warp_perspective`` (the GPU graph's): PIL's pixels but at the image's edges.

    It maps each output pixel's centre with the same matrix (``pixel_origin="corner"``, PIL's convention) and
    samples in float32, rounding where PIL truncates: nearest picks PIL's pixel but where a coordinate falls within
    float32 rounding of a pixel boundary; bilinear is within one level of PIL's where the source point lies a pixel
    or more inside the image, and differs near the edges, where PIL repeats the border row and DALI blends in the
    fill (``tests/transforms/ops/test_warp.py``).
    """
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    interp = {"nearest": types.INTERP_NN, "bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}
    matrix = fn.reshape(fn.cast(params["warp"][2:11], dtype=types.FLOAT), shape=[3, 3])
    return fn.experimental.warp_perspective(
        image,
        matrix=matrix,
        size=params["size"].shape(dtype=types.FLOAT)[0:2],
        fill_value=[float(v) for v in fill],
        interp_type=interp[interpolation],
        pixel_origin="corner",
        border_mode="constant",
        inverse_map=True,
        device=device,
    )


def _run(out: np.ndarray, _size: np.ndarray, image: np.ndarray, params: np.ndarray) -> None:
    # What the cached entry point runs per sample (numba_operator keys its cache on this function).
    warp(out, image, params)


def _setup(outs: Any, ins: Any) -> None:
    for i in range(len(outs[0])):
        outs[0][i][0], outs[0][i][1], outs[0][i][2] = ins[0][i][0], ins[0][i][1], ins[1][i][2]


@dataclass(frozen=True)
class RandomRotation(_Warp):
    """Rotate by an angle uniform in ``degrees`` (a number ``d``: ``(-d, d)``), counter-clockwise, about ``center``.

    ``expand`` grows the output to hold the whole rotated image (its size then varies per sample); ``interpolation``
    is PIL's filter (torchvision's default: nearest); ``fill`` colours what comes from outside the image.
    """

    degrees: float | Sequence[float]
    interpolation: WarpInterpolation = "nearest"
    expand: bool = False
    center: Sequence[float] | None = None
    fill: Fill = 0

    def __post_init__(self) -> None:
        _range("RandomRotation", "degrees", self.degrees)
        _interpolation("RandomRotation", self.interpolation)
        fill_per_channel("RandomRotation", self.fill)
        if self.center is not None and (not isinstance(self.center, Sequence) or len(self.center) != 2):
            raise ValueError(f"RandomRotation: center must be a (x, y) pair, got {self.center!r}")

    @property
    def changes_size(self) -> bool:  # type: ignore[override]
        return bool(self.expand)

    def angle(self, rng: SampleRandom) -> float:
        """Torchvision's ``get_params``: uniform in ``degrees``."""
        low, high = _range("RandomRotation", "degrees", self.degrees)
        return rng.uniform(low, high)

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        m, out = rotation_matrix(self.angle(rng), size[0], size[1], self.expand, self.center)
        return self._params(AFFINE, m, out), out


@dataclass(frozen=True)
class RandomAffine(_Warp):
    """Torchvision's ``RandomAffine``: rotation, translation, scale and shear, each drawn uniformly, about the centre.

    ``translate=(a, b)``: horizontal shift within ``a`` of the width, vertical within ``b`` of the height (rounded
    to whole pixels); ``scale=(lo, hi)``; ``shear``: a number ``s`` or ``(lo, hi)`` shears along x, four values
    along x then y. The output keeps the input's size.
    """

    degrees: float | Sequence[float]
    translate: Sequence[float] | None = None
    scale: Sequence[float] | None = None
    shear: float | Sequence[float] | None = None
    interpolation: WarpInterpolation = "nearest"
    fill: Fill = 0
    center: Sequence[float] | None = None

    def __post_init__(self) -> None:
        _range("RandomAffine", "degrees", self.degrees)
        if self.translate is not None and (len(self.translate) != 2 or not all(0 <= t <= 1 for t in self.translate)):
            raise ValueError(f"RandomAffine: translate must be two values in [0, 1], got {self.translate!r}")
        if self.scale is not None and (len(self.scale) != 2 or not all(s > 0 for s in self.scale)):
            raise ValueError(f"RandomAffine: scale must be two positive values, got {self.scale!r}")
        if self.shear is not None:
            _range("RandomAffine", "shear", self.shear, sizes=(2, 4))
        _interpolation("RandomAffine", self.interpolation)
        fill_per_channel("RandomAffine", self.fill)

    def sample(self, rng: SampleRandom, height: int, width: int) -> tuple[float, tuple[int, int], float,
                                                                          tuple[float, float]]:
        """Torchvision's ``get_params``: ``(angle, (tx, ty), scale, (shear_x, shear_y))``, drawn in that order."""
        low, high = _range("RandomAffine", "degrees", self.degrees)
        angle = rng.uniform(low, high)
        tx = ty = 0
        if self.translate is not None:
            max_dx, max_dy = float(self.translate[0] * width), float(self.translate[1] * height)
            tx = int(round(rng.uniform(-max_dx, max_dx)))
            ty = int(round(rng.uniform(-max_dy, max_dy)))
        scale = 1.0 if self.scale is None else rng.uniform(self.scale[0], self.scale[1])
        shear_x = shear_y = 0.0
        if self.shear is not None:
            shears = _range("RandomAffine", "shear", self.shear, sizes=(2, 4))
            shear_x = rng.uniform(shears[0], shears[1])
            if len(shears) == 4:
                shear_y = rng.uniform(shears[2], shears[3])
        return angle, (tx, ty), scale, (shear_x, shear_y)

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        height, width = size
        angle, translate, scale, shear = self.sample(rng, height, width)
        center = [width * 0.5, height * 0.5] if self.center is None else list(self.center)
        return self._params(AFFINE, affine_matrix(center, angle, translate, scale, shear)[:6], size), size


@dataclass(frozen=True)
class RandomPerspective(_Warp):
    """With probability ``p``, move each corner inwards by up to ``distortion_scale`` of half the side, and warp."""

    distortion_scale: float = 0.5
    p: float = 0.5
    interpolation: WarpInterpolation = "bilinear"
    fill: Fill = 0

    def __post_init__(self) -> None:
        if not 0 <= self.distortion_scale <= 1:
            raise ValueError(f"RandomPerspective: distortion_scale must be in [0, 1], got {self.distortion_scale}")
        if not 0 <= self.p <= 1:
            raise ValueError(f"RandomPerspective: p must be in [0, 1], got {self.p}")
        _interpolation("RandomPerspective", self.interpolation)
        fill_per_channel("RandomPerspective", self.fill)

    def is_identity(self) -> bool:
        return self.p == 0

    def corners(self, rng: SampleRandom, height: int, width: int) -> list[list[int]]:
        """Torchvision's ``get_params``: the end points of the four corners (top-left, clockwise)."""
        bound_w = int(self.distortion_scale * (width // 2)) + 1
        bound_h = int(self.distortion_scale * (height // 2)) + 1
        top_left = [rng.integers(0, bound_w), rng.integers(0, bound_h)]
        top_right = [rng.integers(width - bound_w, width), rng.integers(0, bound_h)]
        bottom_right = [rng.integers(width - bound_w, width), rng.integers(height - bound_h, height)]
        bottom_left = [rng.integers(0, bound_w), rng.integers(height - bound_h, height)]
        return [top_left, top_right, bottom_right, bottom_left]

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        height, width = size
        if not rng.random() < self.p:
            return self._params(AFFINE, _IDENTITY[:6], size, kind=NEAREST), size  # a copy
        start = [[0, 0], [width - 1, 0], [width - 1, height - 1], [0, height - 1]]
        return self._params(PERSPECTIVE, perspective_coefficients(start, self.corners(rng, height, width)), size), size
