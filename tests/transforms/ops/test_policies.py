"""AutoAugment, RandAugment and TrivialAugmentWide: torchvision's names over nvidia.dali.auto_aug."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from stallfree.transforms import AutoAugment, CenterCrop, Normalize, RandAugment, TrivialAugmentWide
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.ops.policies import POLICIES
from stallfree.transforms.random import batch_random
from stallfree.transforms.spec import GraphState


@pytest.mark.slow
def test_policy_graph_runs_and_changes_images() -> None:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    # Two of the three: each policy adds dozens of DALI operators, seconds to define; TrivialAugmentWide goes the
    # same way as RandAugment (nvidia.dali.auto_aug's augmentation list with a uniform choice).
    steps = [RandAugment(num_ops=2, magnitude=9, seed=1), AutoAugment("svhn", seed=3), CenterCrop(16)]
    compiled = CompiledTransforms(steps, dtype="uint8", layout="NHWC")
    assert compiled.param_inputs == {"2.anchor": np.int32}  # the policies draw inside DALI

    @pipeline_def(batch_size=6, num_threads=1, device_id=None, exec_dynamic=True, enable_conditionals=True, seed=4)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        anchor = fn.external_source(name="2.anchor", dtype=types.INT32)
        return compiled.build(source, {"2.anchor": anchor}, device="cpu", encoded=False)

    p = pipe()
    p.build()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(6)]
    p.feed_input("images", images)
    p.feed_input("2.anchor", compiled.draw(batch_random(0, 0, range(6)), [(16, 16)] * 6)["2.anchor"])
    (out,) = p.run()
    outs = [np.array(out[i]) for i in range(6)]
    assert all(o.shape == (16, 16, 3) and o.dtype == np.uint8 for o in outs)
    assert sum(not np.array_equal(o, im) for o, im in zip(outs, images, strict=True)) >= 4


# The first two sub-policies of torchvision's AutoAugmentPolicy tables (transforms/autoaugment.py), each
# (name, probability, magnitude bin); torchvision's policies have 25 sub-policies each.
TORCHVISION_FIRST = {
    "imagenet": [(("posterize", 0.4, 8), ("rotate", 0.6, 9)), (("solarize", 0.6, 5), ("auto_contrast", 0.6, None))],
    "cifar10": [(("invert", 0.1, None), ("contrast", 0.2, 6)), (("rotate", 0.7, 2), ("translate_x", 0.3, 9))],
    "svhn": [(("shear_x", 0.9, 4), ("invert", 0.2, None)), (("shear_y", 0.9, 8), ("invert", 0.7, None))],
}


@pytest.mark.parametrize("policy", [
    pytest.param("imagenet", marks=pytest.mark.xfail(strict=True, reason=(
        "DALI's image_net policy is the TF/EfficientNet v0 table, not torchvision's IMAGENET; see README"))),
    "cifar10", "svhn"])
def test_autoaugment_policy_is_torchvisions_table(policy: str) -> None:
    from nvidia.dali.auto_aug import auto_augment

    table = getattr(auto_augment, f"get_{POLICIES[policy]}_policy")()
    assert len(table.sub_policies) == 25
    first = [tuple((aug.name, prob, mag) for aug, prob, mag in sub) for sub in table.sub_policies[:2]]
    assert first == TORCHVISION_FIRST[policy]


def test_torchvision_names_and_checks() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        AutoAugment("image_net")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"magnitude must be an int in \[0, num_magnitude_bins\)"):
        RandAugment(magnitude=31)
    with pytest.raises(ValueError, match="num_ops must be an int >= 0"):
        RandAugment(num_ops=-1)
    with pytest.raises(ValueError, match="num_magnitude_bins must be an int >= 2"):
        TrivialAugmentWide(num_magnitude_bins=1)


def test_policies_refuse_float_images_when_the_graph_is_built() -> None:
    with pytest.raises(ValueError, match="needs a uint8 image; put it before Normalize"):
        TrivialAugmentWide().build(None, {}, GraphState("cpu", "float32"))
    with pytest.raises(ValueError, match=r"fill must be a value in \[0, 255\] or one per channel \(3\), got \(1, 2\)"):
        RandAugment(fill=(1, 2))


def test_autoaugment_imagenet_warns_that_it_is_not_torchvisions_table() -> None:
    with pytest.warns(UserWarning, match="not torchvision's AutoAugmentPolicy.IMAGENET"):
        AutoAugment("imagenet")


def test_per_channel_fill_fills_each_channel() -> None:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
    from nvidia.dali.auto_aug import augmentations

    from stallfree.transforms.ops.policies import _channel_fill

    rotate, invert = _channel_fill([augmentations.rotate, augmentations.invert])
    assert invert is augmentations.invert  # what does not warp keeps DALI's augmentation

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe() -> Any:
        image = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        return rotate(image, magnitude_bin=30, num_magnitude_bins=31, fill_value=(124, 116, 104),
                      interp_type=types.INTERP_NN)

    p = pipe()
    p.build()
    p.feed_input("images", [np.full((20, 20, 3), 7, np.uint8), np.full((15, 15, 3), 250, np.uint8)])
    (out,) = p.run()
    for i, value in enumerate((7, 250)):
        pixels = np.array(out[i]).reshape(-1, 3)
        assert pixels[0].tolist() == [124, 116, 104]  # a square's corner rotated by 30 degrees leaves it
        assert {tuple(v) for v in pixels.tolist()} == {(124, 116, 104), (value,) * 3}


@pytest.mark.slow
def test_policies_with_a_per_channel_fill_run_in_the_graph() -> None:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    fill = (124, 116, 104)
    steps = [RandAugment(num_ops=2, magnitude=30, fill=fill, seed=2), AutoAugment("svhn", fill=fill, seed=1),
             CenterCrop(16)]
    compiled = CompiledTransforms(steps, dtype="uint8", layout="NHWC")

    @pipeline_def(batch_size=8, num_threads=1, device_id=None, exec_dynamic=True, enable_conditionals=True, seed=4)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        anchor = fn.external_source(name="2.anchor", dtype=types.INT32)
        return compiled.build(source, {"2.anchor": anchor}, device="cpu", encoded=False)

    p = pipe()
    p.build()
    p.feed_input("images", [np.full((16, 16, 3), 200, np.uint8)] * 8)
    p.feed_input("2.anchor", compiled.draw(batch_random(0, 0, range(8)), [(16, 16)] * 8)["2.anchor"])
    (out,) = p.run()
    filled = [bool((np.array(out[i]).reshape(-1, 3) == fill).all(1).any()) for i in range(8)]
    assert any(filled)  # the warps among the drawn operations fill with (124, 116, 104)


@pytest.mark.slow
def test_policies_run_inside_the_loader(image_folder) -> None:
    # Regression: without enable_conditionals DALI raised "DataNode was used in conditional context".
    from stallfree import Loader
    from stallfree.transforms import RandomResizedCrop

    spec = [RandomResizedCrop(24), TrivialAugmentWide(), Normalize()]
    first = list(Loader(image_folder, batch_size=8, transform=spec, num_threads=1, seed=4))
    again = list(Loader(image_folder, batch_size=8, transform=spec, num_threads=1, seed=4))
    assert [images.shape for images, _ in first] == [(8, 3, 24, 24)] * 3
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(first, again, strict=True))
