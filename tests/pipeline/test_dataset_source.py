"""A map-style torch Dataset as the Loader's source: the same batches as the files it holds, and clear errors."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import DatasetReader, Loader
from stallfree.pipeline.readers import FileListReader
from stallfree.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(12, scale=(0.3, 1.0)), RandomHorizontalFlip()]


class Files(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Items are (encoded bytes, label) read from a file list, the kind a user's own storage gives."""

    def __init__(self, source: Path, kind: str = "bytes"):
        self.reader, self.kind = FileListReader(source), kind
        self.targets = self._labels = self.reader.labels().tolist()
        self.reads: list[int] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Any:
        with self._lock:
            self.reads.append(index)
        if self.kind == "pil":
            return Image.open(self.reader.paths[index]), self._labels[index]
        return self.reader.paths[index].read_bytes(), self._labels[index]


def batches(source: Any, **kwargs: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = Loader(source, batch_size=8, transform=SPEC, seed=3, dtype="uint8", num_threads=1, **kwargs)
    return list(loader)


def test_a_dataset_of_bytes_gives_the_same_batches_as_its_files(indexed_list: Path) -> None:
    dataset = Files(indexed_list)
    loader = Loader(dataset, batch_size=8, transform=SPEC, seed=3, dtype="uint8", num_threads=1)
    for (a, la), (b, lb) in zip(list(loader), batches(indexed_list), strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)
    loader.close()  # stops the next epoch's run, started as this one's last batches were taken
    reads = Counter(dataset.reads[1:])  # item 0 read once more, to learn its kind
    assert set(reads) == set(range(37))
    ahead = reads - Counter(range(37))  # read ahead for epoch 1: rows of its first batches (both queues, two in hand)
    first = loader.sampler.rows(loader.sampler.virtual_order(1)[: 8 * (2 * loader.options.run.prefetch + 2)]).tolist()
    assert max(ahead.values(), default=1) == 1 and set(ahead) <= set(first)


def test_a_dataset_of_pil_images_gives_the_same_batches_as_its_files(indexed_list: Path) -> None:
    # Lossless PNGs: pixels decoded by PIL on the host equal those DALI decodes, so the batches match exactly.
    for (a, la), (b, lb) in zip(batches(Files(indexed_list, "pil")), batches(indexed_list), strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_labels_come_from_targets_or_the_argument(indexed_list: Path) -> None:
    dataset = Files(indexed_list)
    del dataset.targets
    with pytest.raises(ValueError, match=r"Files has no `targets`: pass labels="):
        DatasetReader(dataset)
    reader = DatasetReader(dataset, labels=list(range(37)))
    assert reader.classes == [str(i) for i in range(37)] and reader.describe(5) == "Files[5]"
    labels = torch.cat([lb for _, lb in batches(reader, shuffle=False)])
    assert labels.tolist() == list(range(37))


class Items(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, items: list[Any]):
        self.items, self.targets = items, [0] * len(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]


class Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter([])


def _png() -> bytes:
    import io

    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("dataset", "error", "match"),
    [
        (Stream(), TypeError, r"Stream has no __getitem__/__len__: the Loader needs a map-style Dataset"),
        (Items([]), ValueError, r"dataset Items is empty"),
        (Items([b"x"]), ValueError, r"Items\[0\] is bytes, not an \(image, label\) pair"),
        (Items([(np.zeros((4, 4), np.float32), 0)]), ValueError,
         r"Items\[0\]: the image is ndarray of dtype float32 and shape \(4, 4\); expected encoded bytes"),
    ],
)
def test_bad_datasets_are_refused_at_construction(dataset: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Loader(dataset, batch_size=2, transform=[CenterCrop(4)])


def test_an_item_of_another_kind_or_label_is_named() -> None:
    pixels = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match=r"Items\[1\] gives decoded pixels but item 0 gave encoded bytes"):
        list(Loader(Items([(_png(), 0), (pixels, 0)]), batch_size=2, transform=[CenterCrop(4)], shuffle=False))
    with pytest.raises(ValueError, match=r"Items\[1\] has label 4 but the labels say 0"):
        list(Loader(Items([(_png(), 0), (_png(), 4)]), batch_size=2, transform=[CenterCrop(4)], shuffle=False))


def test_a_reader_missing_the_declared_members_is_refused_by_name() -> None:
    import numpy as np

    from stallfree.pipeline.readers import Reader

    class OldStyle:
        classes = ["a"]

        def __len__(self) -> int:
            return 1

        def labels(self) -> np.ndarray:
            return np.zeros(1, np.int64)

        def read(self, index: int) -> np.ndarray:
            return np.zeros(1, np.uint8)

        def describe(self, index: int) -> str:
            return "x"

    assert not isinstance(OldStyle(), Reader)
    with pytest.raises(TypeError, match="OldStyle looks like a Reader but lacks encoded, columns, column"):
        Loader(OldStyle(), 1, transform=[CenterCrop(4)])


def test_a_base_reader_that_skips_super_init_is_refused_by_name() -> None:
    import numpy as np

    from stallfree.pipeline.reader_base import BaseReader

    class Forgetful(BaseReader):
        def __init__(self) -> None:
            self.classes = ["a"]  # no super().__init__()

        def __len__(self) -> int:
            return 1

        def labels(self) -> np.ndarray:
            return np.zeros(1, np.int64)

        def read(self, index: int) -> np.ndarray:
            return np.frombuffer(_png(), np.uint8)

        def describe(self, index: int) -> str:
            return "x"

    with pytest.raises(TypeError, match=r"Forgetful.__init__ did not call super\(\).__init__\(\)"):
        Loader(Forgetful(), batch_size=1, transform=[CenterCrop(4)])


def test_a_base_reader_gets_every_hook_and_its_rules_checked() -> None:
    import numpy as np

    from stallfree.pipeline.reader_base import BaseReader, Reader

    class Pngs(BaseReader):
        def __init__(self, classes: object) -> None:
            super().__init__()
            self.classes = classes  # type: ignore[assignment]

        def __len__(self) -> int:
            return 3

        def labels(self) -> np.ndarray:
            return np.array([0, 1, 0], np.int64)

        def read(self, index: int) -> np.ndarray:
            return np.frombuffer(_png(), np.uint8)

        def describe(self, index: int) -> str:
            return f"png {index}"

    good = Pngs(["a", "b"])
    assert isinstance(good, Reader)  # the protocol's every hook, from the base class
    assert good.shard_rows() is None and good.follow(np.arange(3)) is None and good.close() is None
    loader = Loader(good, batch_size=3, transform=[CenterCrop(4)], shuffle=False)
    images, labels = next(iter(loader))
    assert images.shape == (3, 3, 4, 4) and labels.tolist() == [0, 1, 0]
    with pytest.raises(TypeError, match=r"Pngs.classes must be a list of class names"):
        Loader(Pngs("ab"), batch_size=1, transform=[CenterCrop(4)])
    with pytest.raises(ValueError, match="shuffles the shards of ingested data, but the source is a Pngs"):
        Loader(good, batch_size=1, transform=[CenterCrop(4)], shuffle="block")


def test_a_readers_fingerprint_is_unchanged_by_the_base_class() -> None:
    """A state saved before the Reader base class (kind, name, length and labels hashed) still loads."""
    import hashlib

    import numpy as np

    class Plain:
        classes, encoded, columns, name = ["a"], True, (), "plain"

        def __len__(self) -> int:
            return 2

        def labels(self) -> np.ndarray:
            return np.zeros(2, np.int64)

        def read(self, index: int) -> np.ndarray:
            return np.frombuffer(_png(), np.uint8)

        def describe(self, index: int) -> str:
            return str(index)

        def column(self, name: str, rows: np.ndarray) -> list[int]:
            raise KeyError(name)

    digest = hashlib.sha256(f"{Plain.__qualname__}:plain:2:".encode())
    digest.update(np.zeros(2, np.int64).tobytes())
    loader = Loader(Plain(), batch_size=1, transform=[CenterCrop(4)])
    assert loader.fingerprint()["source"] == digest.hexdigest()
