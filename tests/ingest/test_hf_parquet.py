"""Parquet written by Hugging Face ``datasets`` (``ds.to_parquet``): the ``Image`` struct's bytes, else its path.

Regression (issue 35): ``stallfree ingest`` of ``ds.to_parquet()`` rejected 600/600 rows as "empty file", because
the ``Image`` feature is a struct ``{bytes, path}`` whose ``bytes`` is null when the image came from a file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallfree.ingest.runner import ingest
from stallfree.ingest.sources import plan_source
from stallfree.ingest.writer import IngestOptions

CLASSES = ["circle", "square", "triangle"]


def _features(names: list[str] = CLASSES, label: str = "label") -> datasets.Features:
    return datasets.Features({"image": datasets.Image(), label: datasets.ClassLabel(names=names)})


def _files(folder: Path) -> list[Path]:
    """The folder's images in the order a folder ingest lists them."""
    return sorted(folder.rglob("*.jpg"))


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _rejected(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("form", ["bytes", "path", "bytes-and-name"])
def test_datasets_parquet_ingests_as_the_same_images_from_a_folder(folder, tmp_path, shard_rows, form, monkeypatch):
    root = tmp_path / "data"
    shutil.copytree(folder, root)
    files = _files(root)
    relative = [str(f.relative_to(root)) for f in files]
    if form == "bytes":  # images held in memory: bytes, no path
        images = [{"bytes": f.read_bytes(), "path": None} for f in files]
    elif form == "path":  # images loaded from files: a null bytes field, the path as it was given
        images = relative
        monkeypatch.chdir(root)  # datasets reads the files' sizes, from where the user works
    else:  # embedded for sharing (push_to_hub's embed_table_storage): bytes, and the file name alone
        images = [{"bytes": f.read_bytes(), "path": f.name} for f in files]
    labels = [CLASSES.index(f.parent.name) for f in files]
    ds = datasets.Dataset.from_dict({"image": images, "label": labels}, features=_features())
    ds.to_parquet(str(root / "train.parquet"), batch_size=5)  # 4 row groups, listed one at a time
    cells = pq.read_table(root / "train.parquet").column("image").to_pylist()
    assert (cells[0]["bytes"] is None) == (form == "path")  # the layout the fix is about
    assert pq.ParquetFile(root / "train.parquet").num_row_groups == 4

    ingest(root, tmp_path / "from-folder", IngestOptions(shard_mb=0.004))
    summary = ingest(root / "train.parquet", tmp_path / "from-parquet", IngestOptions(shard_mb=0.004))

    folder_rows, parquet_rows = shard_rows(tmp_path / "from-folder"), shard_rows(tmp_path / "from-parquet")
    assert summary["images"] == len(parquet_rows) == len(files) == 18 and summary["rejected"] == 0
    for column in ("image", "label", "height", "width"):
        assert [r[column] for r in parquet_rows] == [r[column] for r in folder_rows]
    assert [r["image"] for r in parquet_rows] == [f.read_bytes() for f in files]
    named = {"bytes": [f"train.parquet:{i}" for i in range(18)],
             "path": [f"train.parquet:{i}:{p}" for i, p in enumerate(relative)],
             "bytes-and-name": [f"train.parquet:{i}:{f.name}" for i, f in enumerate(files)]}
    assert [r["key"] for r in parquet_rows] == named[form]
    from_folder, from_parquet = _manifest(tmp_path / "from-folder"), _manifest(tmp_path / "from-parquet")
    assert from_parquet["classes"] == from_folder["classes"] == CLASSES
    assert from_parquet["class_counts"] == from_folder["class_counts"] == [6, 6, 6]
    assert _rejected(tmp_path / "from-parquet") == []


def test_the_class_names_are_the_classlabels_in_its_own_order(tmp_path, encode, shard_rows):
    # not sorted, and the label column not named "label": the ClassLabel feature is found by its type
    names = ["zebra", "ant", "moth"]
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": encode(i), "path": None} for i in range(4)], "species": [2, 0, 0, 1],
         "note": ["a", "b", "c", "d"]},
        features=datasets.Features({"image": datasets.Image(), "species": datasets.ClassLabel(names=names),
                                    "note": datasets.Value("string")}))
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ingest(tmp_path / "d.parquet", tmp_path / "out")
    rows = shard_rows(tmp_path / "out")
    assert [r["label"] for r in rows] == [2, 0, 0, 1] and [r["note"] for r in rows] == ["a", "b", "c", "d"]
    assert "species" not in rows[0]  # the labels, not an extra column
    manifest = _manifest(tmp_path / "out")
    assert manifest["classes"] == names and manifest["class_counts"] == [2, 1, 1]


def test_a_row_with_neither_bytes_nor_a_readable_path_is_a_rejection_naming_it(tmp_path, encode, shard_rows):
    (tmp_path / "data" / "img").mkdir(parents=True)
    (tmp_path / "data" / "img" / "good.jpg").write_bytes(encode(1))
    (tmp_path / "outside.jpg").write_bytes(encode(2))
    images = [{"bytes": encode(0), "path": None}, None, "img/good.jpg", "img/missing.jpg", "../outside.jpg",
              str(tmp_path / "data" / "img" / "good.jpg")]
    ds = datasets.Dataset.from_dict({"image": images, "label": [0, 1, 0, 1, 0, 1]},
                                    features=_features(["a", "b"]))
    ds.to_parquet(str(tmp_path / "data" / "d.parquet"), batch_size=6)  # a batch size: no look at the files
    summary = ingest(tmp_path / "data" / "d.parquet", tmp_path / "out")
    rows = shard_rows(tmp_path / "out")
    assert [r["image"] for r in rows] == [encode(0), encode(1)] and [r["label"] for r in rows] == [0, 0]
    rejected = {r["path"]: r["reason"] for r in _rejected(tmp_path / "out")}
    assert summary["rejected"] == len(rejected) == 4
    assert rejected["d.parquet:1"] == "row 1: its 'image' cell holds neither image bytes nor a path"
    assert rejected["d.parquet:3:img/missing.jpg"].startswith("row 3: no image bytes, and its path 'img/missing.jpg'")
    assert rejected["d.parquet:3:img/missing.jpg"].endswith("is refused: missing file")
    assert rejected["d.parquet:4:../outside.jpg"].endswith("refused: path escapes the source root ('..')")
    absolute = rejected[f"d.parquet:5:{tmp_path / 'data' / 'img' / 'good.jpg'}"]
    assert "row 5: no image bytes" in absolute and "absolute path" in absolute and "embed_table_storage" in absolute
    assert not any("empty file" in reason for reason in rejected.values())


def test_a_bytes_and_path_struct_without_datasets_metadata_is_read_alike(tmp_path, encode, shard_rows):
    (tmp_path / "a.jpg").write_bytes(encode(3))
    column = pa.array([{"bytes": encode(0), "path": None}, {"bytes": None, "path": "a.jpg"},
                       {"bytes": None, "path": None}], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"image": column, "label": [0, 1, 1]}), tmp_path / "d.parquet")
    summary = ingest(tmp_path / "d.parquet", tmp_path / "out")
    assert [r["image"] for r in shard_rows(tmp_path / "out")] == [encode(0), encode(3)]
    assert summary["rejected"] == 1 and _rejected(tmp_path / "out") == [
        {"path": "d.parquet:2", "reason": "row 2: its 'image' cell holds neither image bytes nor a path"}]


def test_the_no_label_of_a_test_split_is_refused_with_the_fix(tmp_path, encode):
    ds = datasets.Dataset.from_dict({"image": [{"bytes": encode(i), "path": None} for i in range(3)],
                                     "label": [0, -1, 1]}, features=_features(["a", "b"]))
    ds.to_parquet(str(tmp_path / "d.parquet"))
    with pytest.raises(ValueError, match=r"d.parquet row 1: label -1, datasets' 'no label'.*ds.filter"):
        plan_source(tmp_path / "d.parquet")


def test_several_image_columns_are_refused_naming_them(tmp_path, encode):
    images = [{"bytes": encode(i), "path": None} for i in range(2)]
    ds = datasets.Dataset.from_dict(
        {"image": images, "mask": images, "label": [0, 1]},
        features=datasets.Features({"image": datasets.Image(), "mask": datasets.Image(),
                                    "label": datasets.ClassLabel(names=["a", "b"])}))
    ds.to_parquet(str(tmp_path / "d.parquet"))
    with pytest.raises(ValueError, match=r"several Image columns \['image', 'mask'\].*remove_columns"):
        plan_source(tmp_path / "d.parquet")


@pytest.mark.parametrize("parts", [2, 3])
def test_parts_of_a_datasets_parquet_merge_into_one_runs_samples(tmp_path, encode, shard_rows, parts):
    from stallfree.ingest.merge import merge

    (tmp_path / "img").mkdir()
    images: list = []
    for i in range(7):  # bytes and paths in turn, and a row with neither in the last row group
        (tmp_path / "img" / f"{i}.jpg").write_bytes(encode(i))
        images.append(f"img/{i}.jpg" if i % 2 else {"bytes": encode(i), "path": None})
    images.append(None)
    ds = datasets.Dataset.from_dict({"image": images, "label": [i % 3 for i in range(8)]},
                                    features=_features(["a", "b", "c"]))
    ds.to_parquet(str(tmp_path / "d.parquet"), batch_size=2)
    ingest(tmp_path / "d.parquet", tmp_path / "one", IngestOptions(shard_mb=0.002))
    for i in range(parts):
        ingest(tmp_path / "d.parquet", tmp_path / "split", IngestOptions(shard_mb=0.002), part=(i, parts))
    assert merge(tmp_path / "split")["parts"] == parts
    rows = shard_rows(tmp_path / "one")
    assert shard_rows(tmp_path / "split") == rows and [r["image"] for r in rows] == [encode(i) for i in range(7)]
    assert (tmp_path / "split" / "rejected.jsonl").read_text() == (tmp_path / "one" / "rejected.jsonl").read_text()
    assert [r["path"] for r in _rejected(tmp_path / "one")] == ["d.parquet:7"]
