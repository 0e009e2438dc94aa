"""Every source kind round-trips: the shards hold each sample's original bytes, label, key and extra columns."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallfree.ingest.runner import ingest
from stallfree.ingest.verify import info, verify
from stallfree.ingest.writer import IngestOptions


def test_folder_round_trip(folder, tmp_path, shard_rows):
    summary = ingest(folder, tmp_path / "out", IngestOptions(shard_mb=0.004))
    rows = shard_rows(tmp_path / "out")
    files = sorted(folder.rglob("*.jpg"))
    assert summary["images"] == len(rows) == len(files) == 18 and summary["shards"] > 1
    assert [r["key"] for r in rows] == [str(f.relative_to(folder)) for f in files]
    assert [r["image"] for r in rows] == [f.read_bytes() for f in files]
    assert [r["label"] for r in rows] == [["circle", "square", "triangle"].index(f.parent.name) for f in files]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["classes"] == ["circle", "square", "triangle"] and manifest["class_counts"] == [6, 6, 6]
    assert sum(s["rows"] for s in manifest["shards"]) == 18 and manifest["image"]["kind"] == "encoded"
    assert (tmp_path / "out" / "rejected.jsonl").read_text() == ""
    assert verify(tmp_path / "out", decode=True) == []
    assert info(tmp_path / "out")["classes"] == {"circle": 6, "square": 6, "triangle": 6}


def test_csv_list_keeps_further_columns(tmp_path, encode, shard_rows):
    (tmp_path / "img").mkdir()
    lines = ["path,label,weight,note"]
    for i in range(5):
        (tmp_path / "img" / f"{i}.png").write_bytes(encode(i, fmt="PNG"))
        lines.append(f"img/{i}.png,{['cat', 'dog'][i % 2]},{i / 2},n{i}")
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    ingest(tmp_path / "list.csv", tmp_path / "out")
    rows = shard_rows(tmp_path / "out")
    assert [r["label"] for r in rows] == [0, 1, 0, 1, 0]
    assert [r["weight"] for r in rows] == [0.0, 0.5, 1.0, 1.5, 2.0] and rows[3]["note"] == "n3"
    assert rows[2]["image"] == (tmp_path / "img" / "2.png").read_bytes()
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["classes"] == ["cat", "dog"]


def test_parquet_list(tmp_path, encode, shard_rows):
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(encode(i))
    pq.write_table(pa.table({"path": [f"{i}.jpg" for i in range(3)], "label": [2, 0, 1]}), tmp_path / "l.parquet")
    ingest(tmp_path / "l.parquet", tmp_path / "out")
    rows = shard_rows(tmp_path / "out")
    assert [r["label"] for r in rows] == [2, 0, 1] and rows[1]["image"] == encode(1)


@pytest.mark.parametrize("layout", ["struct", "binary"])
def test_parquet_with_image_bytes(tmp_path, encode, shard_rows, layout):
    images = [encode(i) for i in range(7)]
    if layout == "struct":  # the common {bytes, path} layout of exported image datasets
        column = pa.array([{"bytes": b, "path": f"p{i}.jpg"} for i, b in enumerate(images)])
    else:
        column = pa.array(images, pa.binary())
    table = pa.table({"image": column, "label": [i % 3 for i in range(7)], "split": ["train"] * 7})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=3)
    ingest(tmp_path / "d.parquet", tmp_path / "out", IngestOptions(shard_mb=0.002))
    rows = shard_rows(tmp_path / "out")
    assert [r["image"] for r in rows] == images and [r["label"] for r in rows] == [0, 1, 2, 0, 1, 2, 0]
    assert rows[0]["split"] == "train"
    assert rows[4]["key"] == ("d.parquet:4:p4.jpg" if layout == "struct" else "d.parquet:4")


def test_webdataset_tars(tmp_path, encode, shard_rows, write_tar):
    (tmp_path / "wds").mkdir()
    expected = []
    for t in range(2):
        members = []
        for i in range(3):
            image = encode(10 * t + i, fmt="PNG" if i == 1 else "JPEG")
            members += [(f"s{t}{i}.{'png' if i == 1 else 'jpg'}", image), (f"s{t}{i}.cls", str(i + t).encode())]
            expected.append((image, i + t))
        write_tar(tmp_path / "wds" / f"train-{t}.tar", members)
    ingest(tmp_path / "wds", tmp_path / "out")
    rows = shard_rows(tmp_path / "out")
    assert [(r["image"], r["label"]) for r in rows] == expected
    assert rows[0]["key"] == "train-0.tar:s00"
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["classes"] == ["0", "1", "2", "3"]


def test_unknown_source_is_a_clear_error(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ValueError, match="expected an image folder"):
        ingest(tmp_path / "x.txt", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ingest(tmp_path / "missing", tmp_path / "out")
    (tmp_path / "l.csv").write_text("file,label\na.jpg,0\n")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['path'\]"):
        ingest(tmp_path / "l.csv", tmp_path / "out")


def _every_kind(tmp_path, encode, write_tar) -> dict:
    """One small source of each kind that splits into units: rows, row groups, tars."""
    (tmp_path / "img").mkdir()
    lines = ["path,label,note"]
    for i in range(7):
        (tmp_path / "img" / f"{i}.jpg").write_bytes(encode(i))
        lines.append(f"img/{i}.jpg,{['cat', 'dog', 'eel'][i % 3]},n{i}")
    lines.append("img/missing.jpg,cat,gone")  # a listing rejection in the last part
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    images = pa.array([encode(i) for i in range(7)], pa.binary())
    table = pa.table({"image": images, "label": [i % 3 for i in range(7)]})
    pq.write_table(table, tmp_path / "bytes.parquet", row_group_size=2)
    (tmp_path / "wds").mkdir()
    for t in range(3):  # the largest label is in the last tar only: each part knows fewer classes
        write_tar(tmp_path / "wds" / f"t-{t}.tar", [(f"s{i}.jpg", encode(10 * t + i)) for i in range(2)]
                  + [(f"s{i}.cls", str(t * 2 + i).encode()) for i in range(2)])
    return {"file list": tmp_path / "list.csv", "parquet": tmp_path / "bytes.parquet", "tars": tmp_path / "wds"}


@pytest.mark.parametrize("kind", ["file list", "parquet", "tars"])
@pytest.mark.parametrize("parts", [2, 3, 5])
def test_parts_of_every_kind_merge_into_one_runs_samples(tmp_path, encode, write_tar, shard_rows, kind, parts):
    from stallfree.ingest.merge import merge

    source = _every_kind(tmp_path, encode, write_tar)[kind]
    ingest(source, tmp_path / "one", IngestOptions(shard_mb=0.002))
    for i in range(parts):
        ingest(source, tmp_path / "split", IngestOptions(shard_mb=0.002), part=(i, parts))
    assert merge(tmp_path / "split")["parts"] == parts
    assert shard_rows(tmp_path / "split") == shard_rows(tmp_path / "one")
    merged, one = (json.loads((tmp_path / o / "manifest.json").read_text()) for o in ("split", "one"))
    assert (merged["classes"], merged["class_counts"], merged["rejected"]) == (
        one["classes"], one["class_counts"], one["rejected"])
    assert (tmp_path / "split" / "rejected.jsonl").read_text() == (tmp_path / "one" / "rejected.jsonl").read_text()
    assert verify(tmp_path / "split") == []


def test_a_label_column_of_fractions_is_refused(tmp_path, encode):
    (tmp_path / "a.jpg").write_bytes(encode(0))
    (tmp_path / "l.csv").write_text("path,label\na.jpg,1.5\n")
    with pytest.raises(ValueError, match=r"l\.csv row 0: label 1\.5 is not a whole number"):
        ingest(tmp_path / "l.csv", tmp_path / "out")
