"""torchvision's own transform objects, translated into the spec with their parameters (needs torchvision)."""

from __future__ import annotations

import pytest

from stallfree.transforms import (
    AutoAugment,
    CenterCrop,
    ColorJitter,
    Grayscale,
    Normalize,
    RandAugment,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
    Resize,
    TrivialAugmentWide,
)
from stallfree.transforms.ops.containers import RandomApply
from stallfree.transforms.ops.geometry import Pad
from stallfree.transforms.translation.translator import to_steps

pytestmark = pytest.mark.torchvision


@pytest.fixture(params=["v1", "v2"])
def T(request):  # noqa: N802 - torchvision's own alias
    if request.param == "v1":
        import torchvision.transforms as T
    else:
        import torchvision.transforms.v2 as T
    return T


def tensor_steps(T):
    """The conversion to a [0, 1] float tensor in each API."""
    import torch

    return [T.ToTensor()] if hasattr(T, "ToTensor") and not hasattr(T, "ToImage") else [
        T.ToImage(), T.ToDtype(torch.float32, scale=True)]


def test_imagenet_train_and_eval_recipes(T) -> None:
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    train = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *tensor_steps(T), T.Normalize(mean, std)])
    val = T.Compose([T.Resize(256), T.CenterCrop(224), *tensor_steps(T), T.Normalize(mean, std)])
    assert to_steps(train).steps == (RandomResizedCrop((224, 224)), RandomHorizontalFlip(0.5), Normalize(mean, std))
    assert to_steps(val).steps == (Resize(256), CenterCrop((224, 224)), Normalize(mean, std))
    assert to_steps(val).dtype in (None, "float32")


def test_every_listed_class_with_its_parameters(T) -> None:
    pipeline = [
        T.RandomResizedCrop((30, 40), scale=(0.2, 0.9), ratio=(0.5, 2.0)),
        T.Resize([32], max_size=60),
        T.CenterCrop(24),
        T.RandomHorizontalFlip(0.3),
        T.RandomVerticalFlip(0.7),
        T.ColorJitter(0.4, (0.5, 1.5), 0.2, 0.1),
        T.RandomGrayscale(0.2),
        T.AutoAugment(T.AutoAugmentPolicy.CIFAR10),
        T.RandAugment(num_ops=3, magnitude=5),
        T.TrivialAugmentWide(num_magnitude_bins=21),
        *tensor_steps(T),
        T.Normalize((0.5,), (0.25,)),
        T.RandomErasing(p=0.4, scale=(0.1, 0.2), ratio=(0.5, 1.5), value=0),
    ]
    assert to_steps(pipeline).steps == (
        RandomResizedCrop((30, 40), (0.2, 0.9), (0.5, 2.0)),
        Resize(32, max_size=60),
        CenterCrop((24, 24)),
        RandomHorizontalFlip(0.3),
        RandomVerticalFlip(0.7),
        ColorJitter((0.6, 1.4), (0.5, 1.5), (0.8, 1.2), (-0.1, 0.1)),
        RandomGrayscale(0.2),
        AutoAugment("cifar10"),
        RandAugment(3, 5),
        TrivialAugmentWide(21),
        Normalize((0.5,), (0.25,)),
        RandomErasing(0.4, (0.1, 0.2), (0.5, 1.5), 0),
    )


def test_random_erasing_value_random_and_grayscale(T) -> None:
    steps = to_steps([T.Grayscale(1), *tensor_steps(T), T.RandomErasing(value="random")]).steps
    assert steps == (Grayscale(1), Normalize((0.0,), (1.0,)), RandomErasing(value="random"))


def test_a_float_step_before_normalize_sees_floats_as_torchvision(T) -> None:
    # ToTensor, then RandomErasing on [0, 1] floats, then Normalize: the graph converts where torchvision does.
    steps = to_steps([T.CenterCrop(8), *tensor_steps(T), T.RandomErasing(), T.Normalize((0.5,), (0.5,))]).steps
    assert steps == (CenterCrop((8, 8)), Normalize((0.0,), (1.0,)), RandomErasing(), Normalize((0.5,), (0.5,)))


def test_uint8_tensor_pipelines_ask_for_uint8_output() -> None:
    import torch
    import torchvision.transforms as T1
    import torchvision.transforms.v2 as T2

    assert to_steps([T1.CenterCrop(8), T1.PILToTensor()]).dtype == "uint8"
    assert to_steps([T2.CenterCrop(8), T2.ToImage()]).dtype == "uint8"
    half = to_steps([T2.CenterCrop(8), T2.ToImage(), T2.ToDtype(torch.float16, scale=True)])
    assert half.dtype == "float16" and half.steps == (CenterCrop((8, 8)),)
    unscaled = to_steps([T2.CenterCrop(8), T2.ToImage(), T2.ToDtype(torch.float32), T2.Normalize([127.5], [2.0])])
    assert unscaled.steps == (CenterCrop((8, 8)), Normalize((0.5,), (2 / 255,)))


def test_normalize_before_to_tensor_is_refused(T) -> None:
    with pytest.raises(ValueError, match=r"transform\[1\]: Normalize before ToTensor"):
        to_steps(T.Compose([T.CenterCrop(8), T.Normalize((0.5,), (0.5,))]))


def test_other_torchvision_classes_and_lambdas_are_refused_by_name(T) -> None:
    with pytest.raises(TypeError, match=r"transform\[0\] is torchvision.*Lambda: .*@kernel"):
        to_steps([T.Lambda(lambda x: x)])


def test_refusals_of_geometric_steps_say_what_to_do_and_do_not_advise_a_kernel(T) -> None:
    advice = {
        T.ElasticTransform(): r"its displacement field moves pixels, which a per-pixel @kernel cannot do; apply it to "
                              r"the Loader's output batch",
        T.FiveCrop(8): r"it makes five images of each sample.*five_crop takes batches",
        T.TenCrop(8): r"it makes ten images of each sample",
    }
    for step, match in advice.items():
        with pytest.raises(TypeError, match=rf"transform\[1\] is torchvision.*{type(step).__name__}: stallfree "
                                            rf"does not reproduce it: {match}") as caught:
            to_steps([T.CenterCrop(8), step])
        assert "write it as a per-pixel @kernel" not in str(caught.value)


def test_batch_mixing_points_to_stallfrees_batch_ops() -> None:
    import torchvision.transforms.v2 as T2

    with pytest.raises(TypeError, match=r"MixUp: stallfree does not reproduce it: .*stallfree.transforms.MixUp"):
        to_steps([T2.MixUp(num_classes=10)])
    with pytest.raises(TypeError, match=r"RandomIoUCrop: .*bounding boxes, which the Loader does not carry"):
        to_steps([T2.RandomIoUCrop()])


def test_random_choice_keeps_a_compose_as_one_branch(T) -> None:
    steps = to_steps([T.RandomChoice([T.Compose([T.Pad(2), T.CenterCrop(10)]), T.RandomHorizontalFlip(1.0)]),
                      T.CenterCrop(10)]).steps
    choice = steps[0]
    assert choice.transforms == (RandomApply((Pad(2), CenterCrop((10, 10))), 1.0), RandomHorizontalFlip(1.0))


def test_bicubic_and_nearest_translate_and_other_interpolations_are_refused(T) -> None:
    modes = T.InterpolationMode
    steps = to_steps([T.Resize(8, interpolation=modes.BICUBIC), T.RandomResizedCrop(6, interpolation=modes.NEAREST)])
    assert steps.steps == (Resize(8, interpolation="bicubic"), RandomResizedCrop((6, 6), interpolation="nearest"))
    assert to_steps(T.Resize(8, interpolation=modes.LANCZOS)).steps == (Resize(8, interpolation="lanczos"),)
    # On PIL images torchvision resizes NEAREST_EXACT with PIL's NEAREST.
    assert to_steps(T.Resize(8, interpolation=modes.NEAREST_EXACT)).steps == (Resize(8, interpolation="nearest"),)
    with pytest.raises(ValueError, match=r"Resize\(interpolation='area'\) is not reproduced.*BILINEAR, "
                                         r"BICUBIC, NEAREST, BOX, HAMMING or LANCZOS"):
        to_steps(T.Resize(8, interpolation="area"))


def test_the_translation_imports_torchvision_only_for_its_objects() -> None:
    import subprocess
    import sys

    code = (
        "import sys, stallfree; from stallfree.transforms.translation.translator import to_steps; "
        "from stallfree.transforms import CenterCrop; to_steps([CenterCrop(8)]); "
        "assert not [m for m in sys.modules if m.startswith('torchvision')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_per_channel_policy_fill_translates_and_runs(T, tmp_path) -> None:
    import numpy as np
    from PIL import Image

    from stallfree import Loader

    for i in range(4):
        Image.fromarray(np.full((20, 24, 3), 40 * i, np.uint8)).save(tmp_path / f"{i}.png")
    (tmp_path / "list.csv").write_text("path,label\n" + "".join(f"{i}.png,{i % 2}\n" for i in range(4)))
    pipeline = [T.RandAugment(fill=[124, 116, 104]), T.CenterCrop(16)]
    step = to_steps(T.Compose(pipeline)).steps[0]
    assert isinstance(step, RandAugment) and step.fill == (124, 116, 104)
    images, _ = next(iter(Loader(tmp_path / "list.csv", batch_size=4, transform=T.Compose(pipeline), dtype="uint8")))
    assert images.shape == (4, 3, 16, 16)
