"""AutoAugment, RandAugment and TrivialAugmentWide under torchvision's names, run by DALI's ``nvidia.dali.auto_aug``.

DALI ships these policies as graph operators (Cubuk et al. 2019, 2020; Müller and Hutter 2021), so they are
exposed, not rewritten. Two differences from the rest of the spec, both DALI's design:

- Their random choices (which operation, its sign) are drawn by DALI's own random operators from the pipeline's
  seed, not from the sample-keyed generator: a run is repeatable from its seed but a sample's policy draw depends
  on the batch it falls in, so it is not reproduced exactly by a mid-epoch resume.
- They select operations with DALI's conditional execution, so the pipeline must be defined with
  ``enable_conditionals=True``.

They take uint8 HWC images (put them before ``Normalize``), on the CPU or the GPU. ``fill`` is one value or one per
channel (torchvision's ``fill=[124, 116, 104]``): DALI's warps take one value, so a per-channel fill runs each
geometric operation twice (filled with 0 and with 255) and blends ``fill`` in where the second is brighter, as
torchvision's tensor path blends its fill by the warped mask (exact with the default nearest interpolation).

``AutoAugment("imagenet")`` is DALI's ``image_net`` table (the TF/EfficientNet policy), not torchvision's
``AutoAugmentPolicy.IMAGENET``: constructing it warns.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from nvidia.dali.pipeline import do_not_convert

from stallfree.transforms.spec import GraphState, Transform

__all__ = ["AutoAugment", "RandAugment", "TrivialAugmentWide"]

Interpolation = Literal["nearest", "bilinear"]
#: torchvision's ``AutoAugmentPolicy`` values and the DALI policy each is.
POLICIES = {"imagenet": "image_net", "cifar10": "reduced_cifar10", "svhn": "svhn"}


Fill = int | Sequence[int] | None


def _fill_value(name: str, fill: Fill) -> int | tuple[int, ...] | None:
    """``fill`` as one int, three ints (one per channel), or ``None`` (black)."""
    if fill is None:
        return None
    values: list[Any] | None = [fill] if isinstance(fill, numbers.Real) else (
        list(fill) if isinstance(fill, Sequence) else None)
    if values is None or len(values) not in (1, 3) or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 <= float(v) <= 255 for v in values):
        raise ValueError(f"{name}: fill must be a value in [0, 255] or one per channel (3), got {fill!r}")
    ints = tuple(int(v) for v in values)
    return ints[0] if len(set(ints)) == 1 else ints


def _common(name: str, state: GraphState, interpolation: str, fill: Fill) -> dict[str, Any]:
    import nvidia.dali.types as dali_types

    types: Any = dali_types
    if state.dtype != "uint8":
        raise ValueError(f"{name} needs a uint8 image; put it before Normalize")
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(f"{name}: interpolation must be 'nearest' or 'bilinear', got {interpolation!r}")
    value = _fill_value(name, fill)
    interp = types.INTERP_NN if interpolation == "nearest" else types.INTERP_LINEAR
    return {"fill_value": 0 if value is None else value, "interp_type": interp}


@do_not_convert
def _channel_fill(augmentations: list[Any]) -> list[Any]:
    """The augmentations, with those that fill (the warps) taking one fill value per channel."""
    import inspect

    from nvidia.dali.auto_aug.core import _augmentation

    class ChannelFill(_augmentation.Augmentation):
        def __call__(self, data: Any, **kwargs: Any) -> Any:
            import nvidia.dali.fn as fn
            import nvidia.dali.types as types

            fill = kwargs.pop("fill_value")
            bin_ = kwargs.get("magnitude_bin")
            if self.randomly_negate and bin_ is not None and not isinstance(bin_, _augmentation._SignedMagnitudeBin):
                kwargs["magnitude_bin"] = _augmentation.signed_bin(bin_)  # one sign for both warps
            dark = fn.cast(super().__call__(data, fill_value=0, **kwargs), dtype=types.FLOAT)
            bright = fn.cast(super().__call__(data, fill_value=255, **kwargs), dtype=types.FLOAT)
            per_channel = types.Constant(np.array(fill, np.float32).reshape(1, 1, -1) / 255)
            return fn.cast(dark + (bright - dark) * per_channel, dtype=types.UINT8)

    return [aug.augmentation(augmentation_cls=ChannelFill)
            if "fill_value" in inspect.signature(aug.op).parameters else aug for aug in augmentations]


def _check_bins(name: str, num_magnitude_bins: int) -> None:
    if not isinstance(num_magnitude_bins, int) or num_magnitude_bins < 2:
        raise ValueError(f"{name}: num_magnitude_bins must be an int >= 2, got {num_magnitude_bins!r}")


@do_not_convert  # DALI's AutoGraph (enable_conditionals=True) has no zip(strict=...); nothing here branches on data
def _policy_with_channel_fill(policy: Any) -> Any:
    """``policy`` with its warps taking one fill value per channel (each augmentation wrapped once)."""
    from nvidia.dali.auto_aug.core import Policy

    unique = list({id(aug): aug for sub in policy.sub_policies for aug, _, _ in sub}.values())
    wrapped = {id(aug): new for aug, new in zip(unique, _channel_fill(unique), strict=True)}
    sub_policies = [[(wrapped[id(aug)], p, mag) for aug, p, mag in sub] for sub in policy.sub_policies]
    return Policy(policy.name, policy.num_magnitude_bins, sub_policies)


@dataclass(frozen=True)
class AutoAugment(Transform):
    """AutoAugment with a learned policy: ``"imagenet"``, ``"cifar10"`` or ``"svhn"`` (torchvision's names).

    ``interpolation`` and ``fill`` default as torchvision's (nearest, black); ``fill`` may be one value per channel.
    ``seed`` seeds DALI's policy draws. ``"imagenet"`` is DALI's table, not torchvision's (it warns).
    """

    conditionals = True

    policy: Literal["imagenet", "cifar10", "svhn"] = "imagenet"
    interpolation: Interpolation = "nearest"
    fill: Fill = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"AutoAugment: policy must be one of {sorted(POLICIES)}, got {self.policy!r}")
        _fill_value("AutoAugment", self.fill)
        if self.policy == "imagenet":
            warnings.warn(
                "AutoAugment('imagenet') runs DALI's image_net policy (the TF/EfficientNet table), not torchvision's "
                "AutoAugmentPolicy.IMAGENET: its sub-policies and magnitudes differ. The 'cifar10' and 'svhn' "
                "policies have torchvision's sub-policies; RandAugment and TrivialAugmentWide need no table",
                UserWarning,
                stacklevel=3,
            )

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        from nvidia.dali.auto_aug import auto_augment

        common = _common("AutoAugment", state, self.interpolation, self.fill)
        if not isinstance(common["fill_value"], tuple):
            out = auto_augment.auto_augment(image, policy_name=POLICIES[self.policy], seed=self.seed, **common)
            return out, state
        table = getattr(auto_augment, f"get_{POLICIES[self.policy]}_policy")(use_shape=False)
        out = auto_augment.apply_auto_augment(_policy_with_channel_fill(table), image, self.seed, **common)
        return out, state


@dataclass(frozen=True)
class RandAugment(Transform):
    """RandAugment: ``num_ops`` operations drawn uniformly, each at ``magnitude`` of ``num_magnitude_bins``."""

    conditionals = True

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: Interpolation = "nearest"
    fill: Fill = None
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
        _fill_value("RandAugment", self.fill)

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        from nvidia.dali.auto_aug import rand_augment

        common = _common("RandAugment", state, self.interpolation, self.fill)
        if not isinstance(common["fill_value"], tuple):
            out = rand_augment.rand_augment(
                image, n=self.num_ops, m=self.magnitude, num_magnitude_bins=self.num_magnitude_bins, seed=self.seed,
                **common,
            )
            return out, state
        suite = _channel_fill(rand_augment.get_rand_augment_suite(use_shape=False))
        out = rand_augment.apply_rand_augment(suite, image, self.num_ops, self.magnitude,
                                              num_magnitude_bins=self.num_magnitude_bins, seed=self.seed, **common)
        return out, state


@dataclass(frozen=True)
class TrivialAugmentWide(Transform):
    """TrivialAugment (wide): one operation and one magnitude bin, both uniform, per sample."""

    conditionals = True

    num_magnitude_bins: int = 31
    interpolation: Interpolation = "nearest"
    fill: Fill = None
    seed: int | None = None

    def __post_init__(self) -> None:
        _check_bins("TrivialAugmentWide", self.num_magnitude_bins)
        _fill_value("TrivialAugmentWide", self.fill)

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        from nvidia.dali.auto_aug import trivial_augment

        common = _common("TrivialAugmentWide", state, self.interpolation, self.fill)
        if not isinstance(common["fill_value"], tuple):
            out = trivial_augment.trivial_augment_wide(
                image, num_magnitude_bins=self.num_magnitude_bins, seed=self.seed, **common
            )
            return out, state
        suite = _channel_fill(trivial_augment.get_trivial_augment_wide_suite(use_shape=False))
        out = trivial_augment.apply_trivial_augment(suite, image, num_magnitude_bins=self.num_magnitude_bins,
                                                    seed=self.seed, **common)
        return out, state
