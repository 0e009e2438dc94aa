"""AugMix (Hendrycks et al. 2020) with torchvision's definition, every random choice drawn per sample on the host.

torchvision's ``AugMix.forward`` on a uint8 image (PIL images go through the same tensor code)::

    m ~ Dirichlet(alpha, alpha);  w ~ Dirichlet(alpha, ..., alpha) * m[1]            (mixture_width weights)
    mix = m[0] * image
    for each chain i:  depth = chain_depth, or uniform in {1, 2, 3}
                       aug = image; depth times: op uniform among the ops, bin uniform below severity, a sign
                       mix += w[i] * aug
    uint8(mix)                                                                       (truncated)

Here the draws come from the sample's stream (the Dirichlet weights from keyed gammas: the same distribution, not
torch's numbers), each chain slot picks its operation with DALI's conditional execution, and the operations are
stallfree's: the warps are ``fn.warp_affine`` with torchvision's inverse affine matrix moved to DALI's pixel
convention, the rest the kernels that equal torchvision's tensor functions (``photometric``, ``bundled``, ColorJitter).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stallfree.transforms.kernels.color import BRIGHTNESS, CONTRAST, SATURATION
from stallfree.transforms.ops.adjust import (
    _SHARPNESS,
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
)
from stallfree.transforms.ops.bundled import _SOLARIZE, _posterize
from stallfree.transforms.ops.color import ColorJitter, jitter_node
from stallfree.transforms.ops.warp import affine_matrix
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["AugMix", "OPS", "dirichlet", "inverse_affine", "linspace32"]

#: torchvision's operations, in its ``_augmentation_space`` order (the last four only with ``all_ops``).
OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Posterize", "Solarize", "AutoContrast",
       "Equalize", "Brightness", "Color", "Contrast", "Sharpness")
_SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}
_BINS = 10  # torchvision's _PARAMETER_MAX
_DEPTH = 3  # chain slots: a chain is 1 to 3 operations long
_JITTER = {"Brightness": BRIGHTNESS, "Color": SATURATION, "Contrast": CONTRAST}


def linspace32(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32 as torch's CPU kernel computes it.

    A float32 step, then ``start + step * i`` for the first half and ``end - step * (steps - 1 - i)`` for the
    rest, each with one rounding (torch's fused multiply-add; the double product here is exact).
    """
    start32, end32 = np.float32(start), np.float32(end)
    step = float((end32 - start32) / np.float32(steps - 1))
    values = [float(start32) + step * i if i < steps // 2 else float(end32) - step * (steps - 1 - i)
              for i in range(steps)]
    return np.array(values, np.float32)


def inverse_affine(center: tuple[float, float], angle: float, translate: tuple[float, float],
                   shear: tuple[float, float]) -> np.ndarray:
    """The 2x3 map from output to input coordinates (origin at the image centre) of torchvision's affine, scale 1."""
    return np.array(affine_matrix(center, angle, translate, 1.0, shear)).reshape(2, 3)


def dali_matrix(inverse: np.ndarray, size: Size) -> np.ndarray:
    """``inverse`` (centred coordinates, pixel centres at half-integers from the centre) in DALI's convention.

    torchvision samples output pixel ``j`` at centred ``x = j + 0.5 - w / 2``, and ``grid_sample`` reads the source
    at index ``x_src + w / 2 - 0.5``; DALI maps ``j + 0.5`` to a source position whose pixel centres are at
    ``i + 0.5``. So DALI's matrix is ``M(p - c) + c`` with ``c = (w / 2, h / 2)``.
    """
    h, w = size
    linear, shift = inverse[:, :2], inverse[:, 2]
    centre = np.array([w / 2, h / 2])
    return np.concatenate([linear, (shift + centre - linear @ centre)[:, None]], 1).astype(np.float32).reshape(-1)


def _gamma(rng: SampleRandom, alpha: float) -> float:
    """A Gamma(alpha, 1) variate from the sample's stream (Marsaglia and Tsang 2000; alpha < 1 by boosting)."""
    if alpha < 1.0:
        return _gamma(rng, alpha + 1.0) * (1.0 - rng.random()) ** (1.0 / alpha)
    d = alpha - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        u1, u2 = 1.0 - rng.random(), rng.random()
        x = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        v = (1.0 + c * x) ** 3
        if v > 0 and math.log(1.0 - rng.random()) < 0.5 * x * x + d - d * v + d * math.log(v):
            return d * v


def dirichlet(rng: SampleRandom, alphas: list[float]) -> np.ndarray:
    """A Dirichlet(alphas) draw in float32: independent gammas over their sum."""
    draws = np.array([_gamma(rng, a) for a in alphas])
    return (draws / draws.sum()).astype(np.float32)


@dataclass(frozen=True)
class AugMix(Transform):
    """AugMix as torchvision defines it (``transforms.AugMix``; ``variant="v2"`` for ``transforms.v2.AugMix``).

    Args:
        severity: the operations' strength, 1 to 10 (magnitude bins drawn below it).
        mixture_width: the number of chains.
        chain_depth: each chain's length, or a negative value for 1 to 3 drawn per chain.
        alpha: the Dirichlet concentration of the mixing weights.
        all_ops: include brightness, colour, contrast and sharpness.
        interpolation: the warps' ``"nearest"`` or ``"bilinear"`` sampling.
        fill: the warps' fill value outside the image (one value; ``None`` is 0, as torchvision's).
    """

    severity: int = 3
    mixture_width: int = 3
    chain_depth: int = -1
    alpha: float = 1.0
    all_ops: bool = True
    interpolation: Literal["nearest", "bilinear"] = "bilinear"
    fill: float | None = None
    variant: Literal["v1", "v2"] = "v1"
    params = {"ops": np.int32, "geo": np.float32, "value": np.float32, "jorder": np.int32,
              "jfactors": np.float64, "weights": np.float32, "flags": np.int32}
    conditionals = True

    def __post_init__(self) -> None:
        if not isinstance(self.severity, int) or not 1 <= self.severity <= _BINS:
            raise ValueError(f"AugMix: the severity must be between [1, {_BINS}]. Got {self.severity!r} instead.")
        if not isinstance(self.mixture_width, int) or self.mixture_width < 1:
            raise ValueError(f"AugMix: mixture_width must be an int >= 1, got {self.mixture_width!r}")
        if not isinstance(self.chain_depth, int) or self.chain_depth > _DEPTH or self.chain_depth == 0:
            raise ValueError(f"AugMix: chain_depth must be 1, 2, 3 or negative (1 to 3 at random), got "
                             f"{self.chain_depth!r}")
        if not self.alpha > 0:
            raise ValueError(f"AugMix: alpha must be positive, got {self.alpha!r}")
        if self.interpolation not in ("nearest", "bilinear"):
            raise ValueError(f"AugMix: interpolation must be 'nearest' or 'bilinear', got {self.interpolation!r}")
        if self.fill is not None and not 0 <= self.fill <= 255:
            raise ValueError(f"AugMix: fill must be one value in [0, 255] or None, got {self.fill!r}")

    def ops(self) -> tuple[str, ...]:
        return OPS if self.all_ops else OPS[:9]

    def magnitudes(self, op: str, size: Size) -> np.ndarray | None:
        """The magnitude table torchvision gives ``op`` (``None``: the operation takes none)."""
        h, w = size
        table = {
            "ShearX": (0.0, 0.3), "ShearY": (0.0, 0.3), "TranslateX": (0.0, w / 3.0), "TranslateY": (0.0, h / 3.0),
            "Rotate": (0.0, 30.0), "Solarize": (255.0, 0.0) if self.variant == "v1" else (1.0, 0.0),
            "Brightness": (0.0, 0.9), "Color": (0.0, 0.9), "Contrast": (0.0, 0.9), "Sharpness": (0.0, 0.9),
        }
        if op == "Posterize":
            return (4 - np.round(np.arange(_BINS, dtype=np.float32) / np.float32((_BINS - 1) / 4))).astype(np.float32)
        return None if op not in table else linspace32(*table[op], _BINS)

    def plan(self, rng: SampleRandom, size: Size) -> tuple[np.ndarray, list[list[tuple[str, float]]]]:
        """This sample's mixing weights ``(m[0], w[0], ...)`` and chains of ``(operation, signed magnitude)``.

        Drawn in torchvision's order: the two Dirichlet draws, then per chain its depth and per operation its
        index, magnitude bin and sign.
        """
        ops = self.ops()
        m = dirichlet(rng, [self.alpha, self.alpha])
        weights = np.concatenate([m[:1], dirichlet(rng, [self.alpha] * self.mixture_width) * m[1]])
        chains = []
        for _ in range(self.mixture_width):
            depth = self.chain_depth if self.chain_depth > 0 else rng.integers(1, 4)
            chain = []
            for _ in range(depth):
                op = ops[rng.integers(0, len(ops))]
                table = self.magnitudes(op, size)
                magnitude = float(table[rng.integers(0, self.severity)]) if table is not None else 0.0
                if op in _SIGNED and rng.integers(0, 2):
                    magnitude *= -1.0
                chain.append((op, magnitude))
            chains.append(chain)
        return weights.astype(np.float32), chains

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        slots, ops = self.mixture_width * _DEPTH, self.ops()
        weights, chains = self.plan(rng, size)
        p: dict[str, Any] = {
            "ops": np.full(slots, -1, np.int32), "geo": np.zeros((slots, 6), np.float32),
            "value": np.zeros((slots, 2), np.float32), "jorder": np.full((slots, 4), -1, np.int32),
            "jfactors": np.zeros((slots, 4), np.float64), "weights": weights,
            "flags": np.array([1, 1 if self.variant == "v1" else 2], np.int32),
        }
        for i, chain in enumerate(chains):
            for k, (op, magnitude) in enumerate(chain):
                p["ops"][i * _DEPTH + k] = ops.index(op)
                self._slot(p, i * _DEPTH + k, op, magnitude, size)
        return {name: value.reshape(-1) for name, value in p.items()}, size

    def _slot(self, p: dict[str, Any], slot: int, op: str, magnitude: float, size: Size) -> None:
        """Fill this slot's parameters for ``op`` at ``magnitude``, as torchvision's ``_apply_op`` calls its ops."""
        h, w = size
        if op in ("ShearX", "ShearY"):  # about the top-left corner: centre [0, 0] in pixels
            shear = math.degrees(math.atan(magnitude))
            inverse = inverse_affine((-w * 0.5, -h * 0.5), 0.0, (0.0, 0.0),
                                     (shear, 0.0) if op == "ShearX" else (0.0, shear))
        elif op in ("TranslateX", "TranslateY"):
            shift = (float(int(magnitude)), 0.0) if op == "TranslateX" else (0.0, float(int(magnitude)))
            inverse = inverse_affine((0.0, 0.0), 0.0, shift, (0.0, 0.0))
        elif op == "Rotate":  # F.rotate passes -angle to the same matrix
            inverse = inverse_affine((0.0, 0.0), -magnitude, (0.0, 0.0), (0.0, 0.0))
        else:
            inverse = None
        if inverse is not None:
            p["geo"][slot] = dali_matrix(inverse, size)
        elif op == "Posterize":
            p["value"][slot, 0] = (0xFF << (8 - int(magnitude))) & 0xFF
        elif op == "Solarize":  # v2's magnitudes are fractions of the bound; uint8 v >= t is v >= ceil(t)
            p["value"][slot, 0] = math.ceil(magnitude if self.variant == "v1" else 255 * magnitude)
        elif op == "Sharpness":
            p["value"][slot] = (1.0 + magnitude, 1.0 - (1.0 + magnitude))
        elif op in _JITTER:
            p["jorder"][slot, 0] = _JITTER[op]
            p["jfactors"][slot, _JITTER[op]] = 1.0 + magnitude

    def prepare(self, state: GraphState) -> None:
        if state.dtype != "uint8":
            raise ValueError("AugMix needs a uint8 image (as torchvision's); put it before ToTensor / Normalize")
        RandomAutocontrast(1.0, self.variant).prepare(state)
        RandomEqualize(1.0).prepare(state)
        RandomAdjustSharpness(1.0, 1.0, self.variant).prepare(state)
        ColorJitter(brightness=1.0).prepare(state)
        _SOLARIZE["uint8"].compile(np.uint8, [np.float32, np.int32])
        _posterize.compile(np.uint8, [np.int32, np.int32])

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        import nvidia.dali.fn as fn
        import nvidia.dali.math as dmath
        import nvidia.dali.types as types

        if state.dtype != "uint8":
            raise ValueError("AugMix needs a uint8 image (as torchvision's); put it before ToTensor / Normalize")
        weights = params["weights"].gpu() if state.device == "gpu" else params["weights"]  # beside the image
        mix = fn.cast(image, dtype=types.FLOAT) * weights[0]
        for chain in range(self.mixture_width):
            aug = image
            for k in range(_DEPTH):
                aug = self._build_slot(aug, params, chain * _DEPTH + k, state)
            mix = mix + weights[chain + 1] * fn.cast(aug, dtype=types.FLOAT)
        return fn.cast(dmath.floor(mix), dtype=types.UINT8), state

    def _build_slot(self, image: Any, params: Mapping[str, Any], slot: int, state: GraphState) -> Any:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        op = params["ops"][slot]
        flags = params["flags"]
        value = params["value"][2 * slot : 2 * slot + 2]
        out = image
        for index, name in enumerate(self.ops()):
            if op == index:
                if name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
                    matrix = fn.reshape(params["geo"][6 * slot : 6 * slot + 6], shape=[2, 3])
                    interp = types.INTERP_NN if self.interpolation == "nearest" else types.INTERP_LINEAR
                    out = fn.warp_affine(image, matrix=matrix, fill_value=0.0 if self.fill is None else self.fill,
                                         interp_type=interp, inverse_map=True, device=state.device)
                elif name == "Posterize":
                    out = _posterize.node(image, [fn.cast(value[0:1], dtype=types.INT32), flags[0:1]],
                                          [np.int32, np.int32], state)
                elif name == "Solarize":
                    out = _SOLARIZE["uint8"].node(image, [value[0:1], flags[0:1]], [np.float32, np.int32], state)
                elif name == "AutoContrast":
                    out, _ = RandomAutocontrast(1.0, self.variant).build(image, {"config": flags}, state)
                elif name == "Equalize":
                    out, _ = RandomEqualize(1.0).build(image, {"apply": flags[0:1]}, state)
                elif name == "Sharpness":
                    out = _SHARPNESS["uint8"].node(image, [value, flags], [np.float32, np.int32], state)
                else:
                    out = jitter_node(image, params["jorder"][4 * slot : 4 * slot + 4],
                                      params["jfactors"][4 * slot : 4 * slot + 4], state)
        return out
