"""torch's ``Subset`` and ``random_split`` as the Loader's source, as a DataLoader takes them.

``Loader(Subset(ImageFolder(root, transform=...), rows))`` once failed with "the transforms must give every sample
the same size ... got []": the Subset hid the dataset's transforms. torchvision is not installed in the main test
environment, so :class:`ImageFolder` here is a stand-in with the attributes the Loader reads from torchvision's, under
torchvision's module name (the Loader recognises torchvision's datasets by it); ``Subset`` and ``random_split`` are
torch's own. ``test_subset_torchvision.py`` runs the same idiom with torchvision's real ImageFolder.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Subset, random_split

from stallfree import Loader
from stallfree.transforms import CenterCrop

SPEC = [CenterCrop(16)]  # deterministic: a row's pixels do not depend on where it sits in the order


def default_loader(path: str) -> Image.Image:
    with open(path, "rb") as f:
        return Image.open(f).convert("RGB")


default_loader.__module__ = "torchvision.datasets.folder"  # torchvision's default loader, as the Loader sees it


def custom_loader(path: str) -> Image.Image:
    return default_loader(path)  # a user's own loader=: its items enter the graph as decoded pixels


class ImageFolder(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """torchvision's ImageFolder as far as the Loader reads it: samples, targets, classes, loader, transforms."""

    __module__ = "torchvision.datasets.folder"

    def __init__(self, root: Path, transform: Any = None, target_transform: Any = None, loader: Any = default_loader):
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.samples = [(str(p), i) for i, c in enumerate(self.classes) for p in sorted((root / c).iterdir())]
        self.targets = [label for _, label in self.samples]
        self.loader, self.transform, self.target_transform, self.transforms = loader, transform, target_transform, None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        assert self.transform is None, "the Loader reads a copy without the transforms, which it runs in its graph"
        return self.loader(path), label


def _load(source: Any, **kwargs: Any) -> tuple[torch.Tensor, list[int], list[str]]:
    """Every batch of one unshuffled pass, joined: images, labels and each sample's path."""
    loader = Loader(source, batch_size=5, shuffle=False, dtype="uint8", num_threads=1, columns=["path"], **kwargs)
    images, labels, paths = [], [], []
    for batch, label, extra in loader:
        images.append(batch)
        labels += label.tolist()
        paths += extra["path"]
    return torch.cat(images), labels, paths


@pytest.mark.parametrize("read", [default_loader, custom_loader], ids=["files", "pil-items"])
def test_a_subset_of_an_image_folder_brings_its_transforms_and_keeps_its_rows(image_folder: Path, read: Any) -> None:
    folder = ImageFolder(image_folder, transform=SPEC, loader=read)
    rows = [5, 0, 17, 9, 3, 22, 11]
    subset = Subset(folder, rows)
    images, labels, paths = _load(subset)  # was: "the transforms must give every sample the same size ... got []"
    whole, whole_labels, whole_paths = _load(folder)
    assert labels == [folder.targets[r] for r in rows] == [whole_labels[r] for r in rows]
    named = [folder.samples[r][0] if read is default_loader else f"ImageFolder[{r}]" for r in rows]  # file or item
    assert paths == named == [whole_paths[r] for r in rows]
    assert images.shape == (len(rows), 3, 16, 16) and torch.equal(images, whole[rows])
    loader = Loader(subset, batch_size=2, num_threads=1)
    assert loader.classes == folder.classes and len(loader) == 4


def test_random_split_and_nested_subsets_pick_the_rows_a_dataloader_reads(image_folder: Path) -> None:
    folder = ImageFolder(image_folder, transform=SPEC)
    train, val = random_split(folder, [0.75, 0.25], generator=torch.Generator().manual_seed(0))
    _, train_labels, train_paths = _load(train)
    _, _, val_paths = _load(val)
    assert train_paths == [folder.samples[i][0] for i in train.indices]
    assert train_labels == [folder.targets[i] for i in train.indices]
    assert sorted(train_paths + val_paths) == sorted(path for path, _ in folder.samples)
    nested = Subset(Subset(train, [4, 1, 7]), [2, 0])  # rows 7 and 4 of train
    _, labels, paths = _load(nested)
    assert paths == [folder.samples[train.indices[i]][0] for i in (7, 4)]
    assert labels == [folder.targets[train.indices[i]] for i in (7, 4)]


def test_a_state_of_one_split_is_refused_by_another(image_folder: Path) -> None:
    folder = ImageFolder(image_folder, transform=SPEC)
    train, val = random_split(folder, [12, 12], generator=torch.Generator().manual_seed(1))
    loader = Loader(train, batch_size=4, num_threads=1)
    next(iter(loader))
    with pytest.raises(ValueError, match=r"Loader state has source=.* but this Loader has source="):
        Loader(val, batch_size=4, num_threads=1).load_state_dict(loader.state_dict())


def _png(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((18, 20, 3), value, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


class Items(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A user's own dataset of (encoded bytes, label), with targets."""

    def __init__(self, count: int):
        self.items = [(_png(10 * i), i % 3) for i in range(count)]
        self.targets = [label for _, label in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        return self.items[index]


def test_a_subset_of_any_map_style_dataset_is_a_source() -> None:
    dataset = Items(9)
    images, labels, paths = _load(Subset(dataset, [8, 2, 5]), transform=SPEC)  # was: "Subset has no `targets`"
    assert labels == [2, 2, 2] and paths == ["Items[8]", "Items[2]", "Items[5]"]
    assert images[:, :, 0, 0].tolist() == [[80] * 3, [20] * 3, [50] * 3]


def test_a_transform_on_the_dataset_and_on_the_loader_is_refused_through_a_subset(image_folder: Path) -> None:
    subset = Subset(ImageFolder(image_folder, transform=SPEC), [0, 1])
    with pytest.raises(ValueError, match="ImageFolder has its own transform and Loader got transform= too"):
        Loader(subset, batch_size=2, transform=SPEC)


@pytest.mark.parametrize(("rows", "match"), [
    ([0, 24], r"Subset of ImageFolder: index 24 at position 1 is outside 0 \.\. 23, the rows of the 24-item dataset"),
    ([3, -1], r"Subset of ImageFolder: index -1 at position 1 is outside 0 \.\. 23"),
    ([], r"the Subset of ImageFolder picks no rows"),
])
def test_subset_indices_outside_the_dataset_are_named(image_folder: Path, rows: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Loader(Subset(ImageFolder(image_folder, transform=SPEC), rows), batch_size=2)


def test_loader_dataset_is_the_source_as_given(image_folder: Path) -> None:
    folder = ImageFolder(image_folder, transform=SPEC)
    split = Subset(folder, [1, 2])
    for source, transform in ((folder, ()), (split, ()), (image_folder, SPEC), (str(image_folder), SPEC)):
        assert Loader(source, batch_size=2, transform=transform).dataset is source  # as DataLoader's .dataset
