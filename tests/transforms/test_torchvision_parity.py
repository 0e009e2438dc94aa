"""The switch from DataLoader + torchvision, end to end: the same script's pixels, within the README's tolerance.

An ImageFolder of PNGs (lossless, so decoding is exact), the ImageNet recipes at small sizes. The evaluation
recipe is deterministic and is compared batch for batch with torchvision's DataLoader; the training recipe is
compared sample by sample with torchvision's functional ops run on the window and flip stallfree drew. The
tolerance is the README's: bilinear resizing within one level of PIL's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.transforms import RandomResizedCrop
from stallfree.transforms.random import SampleRandom

pytestmark = pytest.mark.torchvision

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
LEVEL = 1 / 255 / min(STD)  # one 8-bit level, after Normalize


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(3)
    for i in range(12):
        h, w = int(rng.integers(40, 80)), int(rng.integers(40, 80))
        y, x = np.mgrid[0:h, 0:w]
        smooth = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (h + w)], -1)
        pixels = np.clip(smooth + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)
        (root / f"class{i % 3}").mkdir(exist_ok=True)
        Image.fromarray(pixels).save(root / f"class{i % 3}" / f"{i:02d}.png")
    return root


def api(version: str):
    if version == "v1":
        import torchvision.transforms as T

        return T, [T.ToTensor()]
    import torchvision.transforms.v2 as T

    return T, [T.ToImage(), T.ToDtype(torch.float32, scale=True)]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_eval_recipe_by_changing_the_dataloader_line_alone(folder, version) -> None:
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    T, to_tensor = api(version)
    dataset = ImageFolder(folder, transform=T.Compose([T.Resize(36), T.CenterCrop(32), *to_tensor,
                                                       T.Normalize(MEAN, STD)]))
    expected = list(DataLoader(dataset, batch_size=5, shuffle=False))
    got = list(Loader(dataset, batch_size=5, shuffle=False, num_threads=1))
    assert len(got) == len(expected) == 3
    for (images, labels), (ref_images, ref_labels) in zip(got, expected, strict=True):
        assert images.shape == ref_images.shape and images.dtype == ref_images.dtype
        assert torch.equal(labels, ref_labels)
        assert (images - ref_images).abs().max() <= LEVEL * 1.001


def test_train_recipe_matches_torchvision_on_the_same_draws(folder) -> None:
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from torchvision.datasets import ImageFolder

    scale = (0.25, 1.0)
    train = T.Compose([T.RandomResizedCrop(24, scale=scale), T.RandomHorizontalFlip(), T.ToTensor(),
                       T.Normalize(MEAN, STD)])
    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=train, seed=9, num_threads=1, columns=["index"])
    rrc, flips, seen = RandomResizedCrop(24, scale=scale), 0, []
    for images, labels, extra in loader:
        for image, label, index in zip(images, labels, extra["index"].tolist(), strict=True):
            pil, target = plain[index]
            rng = SampleRandom(9, 0, index)  # the sample-keyed stream: the window's draws, then the flip's
            top, left, h, w = rrc.window(rng, pil.height, pil.width)
            ref = F.resized_crop(pil, top, left, h, w, [24, 24], T.InterpolationMode.BILINEAR)
            if rng.random() < 0.5:
                ref, flips = F.hflip(ref), flips + 1
            ref_tensor = F.normalize(F.to_tensor(ref), MEAN, STD)
            assert int(label) == target
            assert (image - ref_tensor).abs().max() <= LEVEL * 1.001, f"sample {index} window {(top, left, h, w)}"
            seen.append(index)
    assert sorted(seen) == list(range(len(plain))) and 0 < flips < len(plain)


def test_grayscale_and_target_transform_from_the_dataset(folder) -> None:
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    T, _ = api("v1")
    dataset = ImageFolder(folder, transform=T.Compose([T.Grayscale(1), T.CenterCrop(30), T.PILToTensor()]),
                          target_transform=lambda y: y * 10)
    (images, labels), *_ = list(Loader(dataset, batch_size=12, shuffle=False, num_threads=1))
    (ref_images, ref_labels), *_ = list(DataLoader(dataset, batch_size=12, shuffle=False))
    assert images.dtype == torch.uint8 and images.shape == (12, 1, 30, 30)
    assert torch.equal(images, ref_images) and torch.equal(labels, ref_labels)


def test_a_dataset_transform_and_a_loader_transform_are_refused_together(folder) -> None:
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(folder, transform=T.CenterCrop(8))
    with pytest.raises(ValueError, match="ImageFolder has its own transform and Loader got transform= too"):
        Loader(dataset, batch_size=4, transform=T.CenterCrop(8))
