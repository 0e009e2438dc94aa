"""The one torch DataLoader baseline: keyed draws, the labelled transform, and every comparison uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stallfree.pipeline.readers import FolderReader
from stallfree.stage_runtime import baseline
from stallfree.stage_runtime.train.feed import TorchFeed


def _files(folder: Path) -> list[tuple[str, int]]:
    reader = FolderReader(folder)
    return [(str(p), int(y)) for p, y in zip(reader.paths, reader.labels(), strict=True)]


def test_a_sample_is_keyed_by_seed_epoch_and_index(image_folder: Path) -> None:
    images = baseline.BaselineImages(_files(image_folder), 16, train=True, seed=3)
    again = baseline.BaselineImages(_files(image_folder), 16, train=True, seed=3)
    x, label = images[(0, 5)]
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32 and label == _files(image_folder)[5][1]
    assert torch.equal(x, again[(0, 5)][0])
    assert not torch.equal(x, images[(1, 5)][0])  # another epoch, another crop
    assert not torch.equal(x, baseline.BaselineImages(_files(image_folder), 16, seed=4)[(0, 5)][0])


def test_evaluation_is_deterministic_and_normalized(image_folder: Path) -> None:
    images = baseline.BaselineImages(_files(image_folder), 16, train=False)
    x = images[(0, 2)][0]
    assert torch.equal(x, images[(7, 2)][0])  # no randomness in evaluation
    # ImageNet normalization: a pixel of 0 maps to -mean/std, of 255 to (1-mean)/std
    low = torch.tensor([-m / s for m, s in zip(baseline.MEAN, baseline.STD, strict=True)])
    high = torch.tensor([(1 - m) / s for m, s in zip(baseline.MEAN, baseline.STD, strict=True)])
    assert (x >= low[:, None, None] - 1e-5).all() and (x <= high[:, None, None] + 1e-5).all()


def test_the_label_says_which_transforms_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(baseline, "has_torchvision", lambda: False)
    assert baseline.transform_label() == "PIL stand-in for torchvision's transforms"
    monkeypatch.setattr(baseline, "has_torchvision", lambda: True)
    assert baseline.transform_label() == "torchvision transforms"


def test_the_dataloader_delivers_every_file_once_per_epoch(image_folder: Path) -> None:
    files = _files(image_folder)
    loader = baseline.torch_dataloader(files, batch_size=4, image_size=8, workers=0, train=False)
    labels = torch.cat([y for _, y in loader])
    assert sorted(labels.tolist()) == sorted(y for _, y in files)


def test_torch_feed_is_the_baseline(image_folder: Path) -> None:
    feed = TorchFeed(str(image_folder), 4, 8, train=True, seed=0, replica=0, replicas=1, workers=0)
    assert isinstance(feed.dataset, baseline.BaselineImages)
    assert feed.fingerprint()["transform"] == baseline.transform_label()


@pytest.mark.torchvision
def test_with_torchvision_the_transforms_are_torchvisions(image_folder: Path) -> None:
    from PIL import Image
    from torchvision import transforms as T

    files = _files(image_folder)
    path = files[3][0]
    images = baseline.BaselineImages(files, 16, train=False)
    with Image.open(path) as img:
        expected = T.Compose([T.Resize(18), T.CenterCrop(16), T.ToTensor(),
                              T.Normalize(baseline.MEAN, baseline.STD)])(img.convert("RGB"))
    assert torch.equal(images[(0, 3)][0], expected)
