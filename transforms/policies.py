"""AutoAugment, RandAugment and TrivialAugmentWide under torchvision's names, run by DALI's ``nvidia.dali.auto_aug``.

DALI ships these policies as graph operators (Cubuk et al. 2019, 2020; Müller and Hutter 2021), so they are
exposed, not rewritten. Two differences from the rest of the spec, both DALI's design:

- Their random choices (which operation, its sign) are drawn by DALI's own random operators from the pipeline's
  seed, not from the sample-keyed generator: a run is repeatable from its seed but a sample's policy draw depends
  on the batch it falls in, so it is not reproduced exactly by a mid-epoch resume.
- They select operations with DALI's conditional execution, so the pipeline must be defined with
  ``enable_conditionals=True``.

They take uint8 HWC images (put them before ``Normalize``), on the CPU or the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stallfree.transforms.spec import GraphState, Transform

__all__ = ["AutoAugment", "RandAugment", "TrivialAugmentWide"]

Interpolation = Literal["nearest", "bilinear"]
#: torchvision's ``AutoAugmentPolicy`` values and the DALI policy each is.
POLICIES = {"imagenet": "image_net", "cifar10": "reduced_cifar10", "svhn": "svhn"}


def _common(name: str, state: GraphState, interpolation: str, fill: int | Sequence[int] | None) -> dict[str, Any]:
    import nvidia.dali.types as dali_types

    types: Any = dali_types
    if state.dtype != "uint8":
        raise ValueError(f"{name} needs a uint8 image; put it before Normalize")
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(f"{name}: interpolation must be 'nearest' or 'bilinear', got {interpolation!r}")
    if fill is not None and not isinstance(fill, int):
        raise ValueError(f"{name}: fill must be one int for all channels (DALI's fill_value), got {fill!r}")
    interp = types.INTERP_NN if interpolation == "nearest" else types.INTERP_LINEAR
    return {"fill_value": 0 if fill is None else int(fill), "interp_type": interp}


def _check_bins(name: str, num_magnitude_bins: int) -> None:
    if not isinstance(num_magnitude_bins, int) or num_magnitude_bins < 2:
        raise ValueError(f"{name}: num_magnitude_bins must be an int >= 2, got {num_magnitude_bins!r}")


@dataclass(frozen=True)
class AutoAugment(Transform):
    """AutoAugment with a learned policy: ``"imagenet"``, ``"cifar10"`` or ``"svhn"`` (torchvision's names).

    ``interpolation`` and ``fill`` default as torchvision's (nearest, black). ``seed`` seeds DALI's policy draws.
    """

    conditionals = True

    policy: Literal["imagenet", "cifar10", "svhn"] = "imagenet"
    interpolation: Interpolation = "nearest"
    fill: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"AutoAugment: policy must be one of {sorted(POLICIES)}, got {self.policy!r}")

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        from nvidia.dali.auto_aug import auto_augment

        common = _common("AutoAugment", state, self.interpolation, self.fill)
        out = auto_augment.auto_augment(image, policy_name=POLICIES[self.policy], seed=self.seed, **common)
        return out, state


@dataclass(frozen=True)
class RandAugment(Transform):
    """RandAugment: ``num_ops`` operations drawn uniformly, each at ``magnitude`` of ``num_magnitude_bins``."""

    conditionals = True

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: Interpolation = "nearest"
    fill: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_bins("RandAugment", self.num_magnitude_bins)
        if not isinstance(self.num_ops, int) or self.num_ops < 0:
            raise ValueError(f"RandAugment: num_ops must be an int >= 0, got {self.num_ops!r}")
        if not isinstance(self.magnitude, int) or not 0 <= self.magnitude < self.num_magnitude_bins:
            raise ValueError(
                f"RandAugment: magnitude must be an int in [0, num_magnitude_bins), got magnitude={self.magnitude!r} "
                f"with num_magnitude_bins={self.num_magnitude_bins}"
            )

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        from nvidia.dali.auto_aug import rand_augment

        common = _common("RandAugment", state, self.interpolation, self.fill)
        out = rand_augment.rand_augment(
            image, n=self.num_ops, m=self.magnitude, num_magnitude_bins=self.num_magnitude_bins, seed=self.seed,
            **common,
        )
        return out, state


@dataclass(frozen=True)
class TrivialAugmentWide(Transform):
    """TrivialAugment (wide): one operation and one magnitude bin, both uniform, per sample."""

    conditionals = True

    num_magnitude_bins: int = 31
    interpolation: Interpolation = "nearest"
    fill: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_bins("TrivialAugmentWide", self.num_magnitude_bins)

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        from nvidia.dali.auto_aug import trivial_augment

        common = _common("TrivialAugmentWide", state, self.interpolation, self.fill)
        out = trivial_augment.trivial_augment_wide(
            image, num_magnitude_bins=self.num_magnitude_bins, seed=self.seed, **common
        )
        return out, state
