"""``random_split`` of torchvision's real ImageFolder: each split gives the batches a DataLoader over it gives.

Once ``Loader(random_split(ImageFolder(root, transform=...), ...)[0])`` failed with "the transforms must give every
sample the same size ... got []". PNGs (lossless) and a crop with no resampling, so the pixels are exactly equal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader

pytestmark = pytest.mark.torchvision


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(5)
    for i in range(12):
        (root / f"class{i % 3}").mkdir(exist_ok=True)
        pixels = rng.integers(0, 256, (int(rng.integers(24, 40)), int(rng.integers(24, 40)), 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"class{i % 3}" / f"{i:02d}.png")
    return root


def test_each_random_split_of_an_image_folder_gives_the_dataloaders_batches(folder: Path) -> None:
    import torchvision.transforms as T
    from torch.utils.data import DataLoader, random_split
    from torchvision.datasets import ImageFolder

    dataset = ImageFolder(folder, transform=T.Compose([T.CenterCrop(20), T.PILToTensor()]))
    splits = random_split(dataset, [8, 4], generator=torch.Generator().manual_seed(0))
    for split in splits:
        loader = Loader(split, batch_size=4, shuffle=False, num_threads=1)
        got, expected = list(loader), list(DataLoader(split, batch_size=4, shuffle=False))
        assert loader.dataset is split and len(got) == len(expected)
        for (images, labels), (ref_images, ref_labels) in zip(got, expected, strict=True):
            assert images.dtype == ref_images.dtype == torch.uint8
            assert torch.equal(images, ref_images) and torch.equal(labels, ref_labels)
