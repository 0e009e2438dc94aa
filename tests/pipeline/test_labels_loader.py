"""The Loader's readers take labels by ingest's rule (issue #37, case 9), each refusal naming its tar member or row.

Before: a ``.cls`` of ``²`` crashed the Loader even under ``on_error="skip"`` (``int('²')``); 20 digits gave an
unnamed ``OverflowError``; 10^12 built a list of 10^12 class names; a file list's labels 1.5 and 3.9 became 1 and 3
silently, while ingest refused them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.pipeline.readers import DatasetReader, FileListReader
from stallfree.transforms import Normalize, Resize

SPEC = [Resize((8, 8)), Normalize()]


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


HOSTILE = [("super", "²".encode()), ("huge", str(10**12).encode()), ("twenty", b"9" * 20), ("half", b"1.5")]


def test_hostile_cls_labels_raise_by_name_or_are_skipped(tmp_path: Path, write_tar: Any) -> None:
    members = [("good.jpg", _jpeg(0)), ("good.cls", b"2")]
    for i, (key, label) in enumerate(HOSTILE, start=1):
        members += [(f"{key}.jpg", _jpeg(i)), (f"{key}.cls", label)]
    members += [("dup.jpg", _jpeg(8)), ("dup.cls", b"0"), ("dup.cls", b"1")]
    write_tar(tmp_path / "a.tar", members)
    with pytest.raises(ValueError, match=r"a\.tar:super: \.cls is not a non-negative integer: '²' \(5 sample\(s\) "
                                         r"refused .*on_error='skip'"):
        Loader(str(tmp_path / "a.tar"), 1, transform=SPEC, cache_dir=tmp_path / "index")
    with pytest.warns(UserWarning, match="5 sample"):
        loader = Loader(str(tmp_path / "a.tar"), 1, transform=SPEC, cache_dir=tmp_path / "index", on_error="skip")
    assert torch.cat([labels for _, labels in loader]).tolist() == [2]
    assert loader.classes == ["0", "1", "2"]
    reader = loader.reader
    assert {r["path"].rsplit(":", 1)[-1]: r["reason"] for r in reader.rejected} == {
        "super": ".cls is not a non-negative integer: '²'",
        "huge": "label 1000000000000 is over 4194303, the largest class number stallfree takes",
        "twenty": f"label {'9' * 20} is over 4194303, the largest class number stallfree takes",
        "half": ".cls is not a non-negative integer: '1.5'",
        "dup": "duplicate member 'dup.cls' in the tar: which one is the sample is ambiguous, so the whole sample is "
               "rejected",
    }


@pytest.mark.parametrize(("labels", "match"), [
    ("0\n1.5\n3.9", r"row 1: label 1.5 is not a whole number"),
    ("0\n1000000000000\n1", r"row 1: label 1000000000000 is over 4194303"),
    ("0\n1\n99999999999999999999", r"row 2: label 1e\+20 is over 4194303"),
    ("0\n-1\n1", r"row 1: negative label -1"),
])
def test_hostile_file_list_labels_are_refused_by_row(tmp_path: Path, labels: str, match: str) -> None:
    rows = [f"{i}.jpg,{label}" for i, label in enumerate(labels.split("\n"))]
    for i in range(len(rows)):
        (tmp_path / f"{i}.jpg").write_bytes(_jpeg(i))
    (tmp_path / "l.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=r"file list \S+l\.csv " + match):
        FileListReader(tmp_path / "l.csv")


def test_whole_float_labels_and_class_names_are_taken(tmp_path: Path) -> None:
    for i in range(2):
        (tmp_path / f"{i}.jpg").write_bytes(_jpeg(i))
    (tmp_path / "f.csv").write_text("path,label\n0.jpg,2.0\n1.jpg,0.0\n")
    (tmp_path / "n.csv").write_text("path,label\n0.jpg,dog\n1.jpg,cat\n")
    floats, names = FileListReader(tmp_path / "f.csv"), FileListReader(tmp_path / "n.csv")
    assert floats.labels().tolist() == [2, 0] and floats.classes == ["0", "1", "2"]
    assert names.labels().tolist() == [1, 0] and names.classes == ["cat", "dog"]


def test_a_nul_byte_in_a_file_list_path_is_refused_by_row(tmp_path: Path) -> None:
    (tmp_path / "0.jpg").write_bytes(_jpeg(0))
    (tmp_path / "l.csv").write_bytes(b"path,label\n0.jpg,0\n0\x00.jpg,1\n")
    with pytest.raises(ValueError, match=r"l\.csv row 1: path '0\\x00\.jpg' is refused: the path holds a NUL byte"):
        FileListReader(tmp_path / "l.csv")


def test_a_dataset_s_fractional_targets_are_refused_by_item() -> None:
    class Targets(torch.utils.data.Dataset):
        targets = [0, 1.5]

        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int) -> tuple[bytes, int]:
            return _jpeg(index), int(self.targets[index])

    with pytest.raises(ValueError, match=r"dataset Targets item 1: label 1.5 is not a whole number"):
        DatasetReader(Targets())
