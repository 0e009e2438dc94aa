"""`columns=["index", "path"]` on every source: each batch says which samples it holds and where they live."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stallfree import DatasetReader, Loader
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions
from stallfree.transforms import CenterCrop


class Pixels:
    """A map-style dataset of decoded pixels whose label is the item's index."""

    def __init__(self, n: int):
        self.items = [np.full((12, 12, 3), i, np.uint8) for i in range(n)]
        self.targets = list(range(n))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i], i


@pytest.fixture(scope="module")
def sources(indexed_list: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder = tmp_path_factory.mktemp("classes")
    for i in range(6):
        (folder / f"c{i % 2}").mkdir(exist_ok=True)
        Image.fromarray(np.full((12, 14, 3), i, np.uint8)).save(folder / f"c{i % 2}" / f"{i}.png")
    shards = tmp_path_factory.mktemp("shards")
    ingest(indexed_list, shards, IngestOptions(shard_mb=0.005))
    return {"file list": indexed_list, "folder": folder, "shards": shards, "dataset": DatasetReader(Pixels(9))}


@pytest.mark.parametrize("kind", ["file list", "folder", "shards", "dataset"])
def test_index_and_path_come_with_every_batch(sources, kind) -> None:
    loader = Loader(sources[kind], batch_size=4, transform=CenterCrop(8), shuffle=True, seed=3, num_threads=1,
                    columns=["index", "path"])
    seen = []
    for _images, labels, extra in loader:
        index, paths = extra["index"], extra["path"]
        assert index.dtype.is_floating_point is False and len(index) == len(labels) == len(paths)
        assert np.array_equal(loader.labels[index.numpy()], labels.numpy())
        assert paths == [loader.reader.describe(int(i)) for i in index]
        seen.extend(index.tolist())
    assert sorted(seen) == list(range(len(loader.reader)))  # every sample once, named by its row


def test_file_paths_are_the_files(sources) -> None:
    loader = Loader(sources["folder"], batch_size=6, transform=CenterCrop(8), shuffle=False, num_threads=1,
                    dtype="uint8", columns=["path"])
    ((images, labels, extra),) = list(loader)
    for image, path in zip(images, extra["path"], strict=True):
        assert Path(path).is_file() and int(image[0, 0, 0]) == int(Path(path).stem)


def test_an_unknown_column_names_what_there_is(sources) -> None:
    with pytest.raises(ValueError, match=r"columns=\['paths'\] but the source has columns \['index', 'path'\]"):
        Loader(sources["folder"], batch_size=4, transform=CenterCrop(8), columns=["paths"])
