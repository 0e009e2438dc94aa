"""Hostile labels and keys (issue #37, case 9): refused by one rule, each refusal naming its tar member or row.

Before: a ``.cls`` of ``²`` passed ``isdigit()`` then failed ``int()`` (ingest exit 2, no tar named); a ``.cls``
of 10^12 or a CSV label of 10^12 made a list of 10^12 class names; a duplicate key in a tar silently replaced the
first sample; a NUL byte in a CSV path gave ``ValueError: embedded null byte`` naming no row.
"""

import json

import numpy as np
import pytest

from stallfree.ingest.labels import MAX_CLASSES, label_array, parse_label
from stallfree.ingest.runner import ingest


def rejected(out) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}


@pytest.mark.parametrize(("text", "label"), [(b"0", 0), (b" 7\n", 7), (b"007", 7), (str(MAX_CLASSES - 1).encode(),
                                                                                   MAX_CLASSES - 1)])
def test_a_cls_label_is_ascii_digits_below_the_class_bound(text, label):
    assert parse_label(text) == label


@pytest.mark.parametrize(("text", "match"), [
    ("²".encode(), r"not a non-negative integer: '²'"),
    ("٣".encode(), r"not a non-negative integer: '٣'"),  # an Arabic-Indic three: isdigit() and int() take it
    (b"1.5", r"not a non-negative integer: '1.5'"),
    (b"-1", r"not a non-negative integer: '-1'"),
    (b"", r"not a non-negative integer: ''"),
    (b"10" * 10, r"label 10101010101010101010 is over 4194303, the largest class number"),
    (str(10**12).encode(), r"label 1000000000000 is over 4194303"),
    (str(MAX_CLASSES).encode(), r"label 4194304 is over 4194303"),
])
def test_hostile_cls_labels_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        parse_label(text)


def test_hostile_labels_and_a_duplicate_key_in_a_tar_are_rejected_by_name(tmp_path, encode, write_tar, shard_rows):
    write_tar(tmp_path / "x.tar", [
        ("good.jpg", encode(0)), ("good.cls", b"1"),
        ("super.jpg", encode(1)), ("super.cls", "²".encode()),
        ("huge.jpg", encode(2)), ("huge.cls", str(10**12).encode()),
        ("twenty.jpg", encode(3)), ("twenty.cls", b"9" * 20),
        ("half.jpg", encode(4)), ("half.cls", b"1.5"),
        ("dup.jpg", encode(5)), ("dup.cls", b"0"), ("dup.jpg", encode(6)),
    ])
    summary = ingest(tmp_path / "x.tar", tmp_path / "out")
    assert [(r["key"], r["label"]) for r in shard_rows(tmp_path / "out")] == [("x.tar:good", 1)]
    reasons = rejected(tmp_path / "out")
    assert reasons == {
        "x.tar:super": ".cls is not a non-negative integer: '²'",
        "x.tar:huge": f"label 1000000000000 is over {MAX_CLASSES - 1}, the largest class number stallfree takes",
        "x.tar:twenty": f"label {'9' * 20} is over {MAX_CLASSES - 1}, the largest class number stallfree takes",
        "x.tar:half": ".cls is not a non-negative integer: '1.5'",
        "x.tar:dup": "duplicate member 'dup.jpg' in the tar: which one is the sample is ambiguous, so the whole sample "
                     "is rejected",
    }
    assert summary["rejected"] == 5
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["classes"] == ["0", "1"]


@pytest.mark.parametrize(("value", "match"), [
    ("1000000000000", r"row 1: label 1000000000000 is over 4194303, the largest class number"),
    ("99999999999999999999", r"row 1: label 1e\+20 is over 4194303"),
    ("1.5", r"row 1: label 1.5 is not a whole number"),
    ("-2", r"row 1: negative label -2"),
])
def test_hostile_csv_labels_are_refused_naming_the_row(tmp_path, encode, value, match):
    for name in ("a.jpg", "b.jpg"):
        (tmp_path / name).write_bytes(encode(0))
    (tmp_path / "l.csv").write_text(f"path,label\na.jpg,0\nb.jpg,{value}\n")
    with pytest.raises(ValueError, match=r"file list \S+l\.csv " + match):
        ingest(tmp_path / "l.csv", tmp_path / "out")
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_class_names_beyond_the_bound_are_refused(tmp_path, monkeypatch, encode):
    monkeypatch.setattr("stallfree.ingest.labels.MAX_CLASSES", 2)
    (tmp_path / "a.jpg").write_bytes(encode(0))
    (tmp_path / "l.csv").write_text("path,label\na.jpg,cat\na.jpg,dog\na.jpg,eel\n")
    with pytest.raises(ValueError, match=r"l\.csv holds 3 distinct class names, over 2"):
        ingest(tmp_path / "l.csv", tmp_path / "out")


def test_a_nul_byte_in_a_csv_path_is_rejected_by_name(tmp_path, encode, shard_rows):
    (tmp_path / "a.jpg").write_bytes(encode(0))
    (tmp_path / "l.csv").write_bytes(b"path,label\na.jpg,0\na\x00.jpg,1\n")
    ingest(tmp_path / "l.csv", tmp_path / "out")
    assert [r["key"] for r in shard_rows(tmp_path / "out")] == ["a.jpg"]
    assert rejected(tmp_path / "out") == {"a\x00.jpg": "the path holds a NUL byte"}


def test_label_array_names_the_first_bad_item():
    assert label_array(np.array([0.0, 3.0]), "x").tolist() == [0, 3]
    assert label_array(np.array([1, 2], np.uint64), "x").dtype == np.int64
    with pytest.raises(ValueError, match=r"dataset D item 1: label 3.9 is not a whole number"):
        label_array(np.array([1.0, 3.9]), "dataset D", unit="item")
    with pytest.raises(ValueError, match=r"x row 0: label nan is not a whole number"):
        label_array(np.array([np.nan]), "x")
    with pytest.raises(ValueError, match=r"x row 1: label 18446744073709551615 is over 4194303"):
        label_array(np.array([0, 2**64 - 1], np.uint64), "x")
    with pytest.raises(ValueError, match=r"x: labels must be class names or whole numbers, got <U1"):
        label_array(np.array(["a"]), "x")
