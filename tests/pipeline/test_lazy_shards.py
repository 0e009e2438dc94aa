"""Shards open on first read, labels from ``labels.npy``; datasets of an older stallfree (no labels.npy) still load."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
import torch

from stallfree import Loader
from stallfree.ingest.runner import ingest
from stallfree.ingest.verify import verify
from stallfree.ingest.writer import IngestOptions
from stallfree.pipeline.shards import ShardError, ShardReader
from stallfree.transforms import CenterCrop


@pytest.fixture(scope="module")
def shards(indexed_list: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 37 PNGs whose label is their row index, in several shards."""
    out = tmp_path_factory.mktemp("lazy-shards")
    ingest(indexed_list, out, IngestOptions(shard_mb=0.006))
    assert len(list(out.glob("shard-*.arrow"))) >= 3
    return out


def _copy(shards: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    return copy


def _label_columns(folder: Path) -> np.ndarray:
    pieces = []
    for path in sorted(folder.glob("shard-*.arrow")):
        with pa.memory_map(str(path)) as source:
            pieces.append(ipc.open_file(source).read_all().column("label").to_numpy())
    return np.concatenate(pieces)


def _batches(folder: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = Loader(folder, 5, transform=[CenterCrop(12)], dtype="uint8", num_threads=1, seed=2)
    return [(images, labels) for images, labels in loader]


def test_ingest_writes_labels_npy_that_verify_checks(shards: Path) -> None:
    manifest = json.loads((shards / "manifest.json").read_text())
    entry = manifest["labels"]
    assert entry["file"] == "labels.npy" and entry["dtype"] == "int8"  # 37 classes: the smallest dtype
    assert entry["bytes"] == (shards / "labels.npy").stat().st_size
    labels = np.load(shards / "labels.npy")
    np.testing.assert_array_equal(labels, _label_columns(shards))
    np.testing.assert_array_equal(labels, np.arange(37))
    assert verify(shards) == []


def test_construction_opens_no_shard_and_a_missing_one_is_named_on_first_read(shards: Path, tmp_path: Path) -> None:
    copy = _copy(shards, tmp_path)
    gone = sorted(copy.glob("shard-*.arrow"))[1]
    gone.unlink()
    reader = ShardReader(copy)  # opens nothing but the manifest and labels.npy
    assert reader._open == [None] * len(reader.manifest["shards"])
    np.testing.assert_array_equal(reader.labels(), np.arange(37))
    first = reader.shard_rows()[0]
    assert reader.read_image(0).size > 0 and sum(s is not None for s in reader._open) == 1
    assert reader.describe(first) == f"{gone} row 0"  # describing the failing row does not fail too
    with pytest.raises(ShardError, match=rf"{gone} is listed in .*manifest.json but missing; run `stallfree verify"):
        reader.read(first)
    with pytest.raises(ShardError, match=rf"{gone} is listed"):  # remembered, and raised again for each row
        reader.read(first + 1)
    with pytest.raises(ShardError, match=rf"{gone} is listed"):
        ShardReader(copy, verify="open")  # "open" still opens and hashes everything on construction


def test_a_damaged_labels_npy_is_refused_and_reported(shards: Path, tmp_path: Path) -> None:
    copy = _copy(shards, tmp_path)
    path = copy / "labels.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last label: same size, another value
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{path}: SHA-256 differs from the manifest's \(the file was altered\)"):
        ShardReader(copy)
    assert verify(copy) == [f"{path}: SHA-256 differs from the manifest's (the file was altered)"]
    # A labels.npy whose checksum the manifest agrees with, but whose values are not the shards': named by rows.
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["labels"]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    last = manifest["shards"][-1]
    first = 37 - last["rows"]
    assert verify(copy) == [f"labels.npy: rows {first}..36 differ from {last['file']}'s label column "
                            "(ingest or --merge again)"]
    path.unlink()
    assert verify(copy) == ["labels.npy: missing"]
    with pytest.raises(ShardError, match=rf"{path} is listed in the manifest but missing"):
        ShardReader(copy)


def test_a_dataset_without_labels_npy_loads_with_the_same_labels(shards: Path, tmp_path: Path) -> None:
    copy = _copy(shards, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["labels"]  # as an older stallfree wrote it
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "labels.npy").unlink()
    reader = ShardReader(copy)
    assert reader.labels().dtype == np.int64
    np.testing.assert_array_equal(reader.labels(), ShardReader(shards).labels())
    assert verify(copy) == []
    old, new = _batches(copy), _batches(shards)
    assert len(old) == len(new) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                                        for a, b in zip(old, new, strict=True))
    assert new[0][1].dtype == torch.int64  # labels.npy holds int8 here; the batches' labels are int64 as before
