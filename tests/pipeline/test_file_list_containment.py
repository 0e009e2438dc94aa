"""A file list or folder given to the Loader reads only files inside its own folder, and never echoes their bytes.

Before: a list row ``/etc/passwd`` (or ``../x``, or a link out) was opened, and with ``on_error="skip"`` its first
bytes came back in ``loader.skipped`` ("not a JPEG or PNG image (starts with b'root:x:0')").
"""

import io
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from stallfree import BadSampleError, Loader
from stallfree.ingest.folders import inside_root
from stallfree.ingest.images import BadImage, read_header
from stallfree.pipeline.readers import FileListReader, FolderReader
from stallfree.transforms import CenterCrop

SECRET = b"root:x:0:0:root:/root:/bin/bash\n"


def jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    """``tmp/data`` holding ok.jpg, with ``tmp/secret.jpg`` outside it and ``data/link.jpg`` pointing there."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "ok.jpg").write_bytes(jpeg())
    (tmp_path / "secret.jpg").write_bytes(SECRET)
    os.symlink(tmp_path / "secret.jpg", tmp_path / "data" / "link.jpg")
    return tmp_path / "data"


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ("/etc/passwd", r"row 1: path '/etc/passwd' is refused: absolute path"),
        ("../secret.jpg", r"row 1: path '\.\./secret\.jpg' is refused: path escapes the source root \('\.\.'\)"),
        ("link.jpg", r"row 1: path 'link\.jpg' is refused: path escapes the source root through a link"),
    ],
)
def test_a_csv_row_outside_the_list_folder_is_refused_at_construction(root: Path, row: str, match: str) -> None:
    (root / "list.csv").write_text(f"path,label\nok.jpg,0\n{row},1\n")
    with pytest.raises(ValueError, match=match):
        Loader(root / "list.csv", batch_size=2, transform=[CenterCrop(8)], on_error="skip")


def test_a_parquet_row_outside_the_list_folder_is_refused(root: Path) -> None:
    pq.write_table(pa.table({"path": ["ok.jpg", "ok.jpg", "../secret.jpg"], "label": [0, 1, 0]}), root / "l.parquet")
    with pytest.raises(ValueError, match=r"l\.parquet row 2: path '\.\./secret\.jpg' is refused"):
        FileListReader(root / "l.parquet")


def test_a_folder_link_out_of_the_image_folder_is_refused(root: Path, tmp_path: Path) -> None:
    (root / "a").mkdir()
    (root / "a" / "ok.jpg").write_bytes(jpeg())
    os.symlink(tmp_path / "secret.jpg", root / "a" / "out.jpg")
    with pytest.raises(ValueError, match=r"a/out\.jpg is refused: path escapes the source root through a link"):
        FolderReader(root)
    (root / "a" / "out.jpg").unlink()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", root / "a" / "sub")
    with pytest.raises(ValueError, match=r"a/sub is refused: path escapes the source root through a link"):
        FolderReader(root)
    (root / "a" / "sub").unlink()
    os.symlink(root / "a" / "inner", root / "a" / "in")  # a link that stays inside is followed, as torchvision does
    (root / "a" / "inner").mkdir()
    (root / "a" / "inner" / "x.jpg").write_bytes(jpeg())
    assert sorted(p.name for p in FolderReader(root).paths) == ["ok.jpg", "x.jpg", "x.jpg"]


def test_the_rule_is_ingests(root: Path) -> None:
    assert inside_root(root, ["ok.jpg", "link.jpg", "", "/etc/passwd"]) == [
        (root / "ok.jpg", None),
        (None, "path escapes the source root through a link"),
        (None, "empty path"),
        (None, "absolute path (paths must be relative to the source root)"),
    ]


def test_a_bad_file_inside_the_folder_is_named_but_its_bytes_are_not_echoed(root: Path) -> None:
    with pytest.raises(BadImage) as caught:
        read_header(SECRET)
    assert "root:x" not in str(caught.value) and "not an image the Loader decodes" in str(caught.value)
    (root / "text.jpg").write_bytes(SECRET)
    (root / "list.csv").write_text("path,label\nok.jpg,0\ntext.jpg,1\n")
    skipping = Loader(root / "list.csv", batch_size=2, transform=[CenterCrop(8)], on_error="skip", shuffle=False)
    list(skipping)
    (skipped,) = skipping.skipped
    assert skipped["source"].endswith("text.jpg") and "root:x" not in skipped["reason"]
    raising = Loader(root / "list.csv", batch_size=2, transform=[CenterCrop(8)], shuffle=False)
    with pytest.raises(BadSampleError, match="text.jpg") as error:
        list(raising)
    assert "root:x" not in str(error.value)


def test_spellings_that_stay_inside_are_taken_and_each_way_out_is_refused(root: Path, tmp_path: Path) -> None:
    # The rule works on strings (a Path per file was most of a folder scan's time); it must read a path as Path
    # does: './', '//' and a trailing '/' change nothing, '..' anywhere is refused, and so is a link out reached
    # through any spelling of the folder it sits in.
    (root / "sub").mkdir()
    os.symlink(tmp_path / "secret.jpg", root / "sub" / "out.jpg")
    os.symlink(tmp_path, root / "up")
    rows = ["./ok.jpg", "sub//../ok.jpg", ".//sub/./out.jpg", "sub/", "up/secret.jpg", "x/..", "\\abs", "ok.jpg/"]
    assert inside_root(root, rows) == [
        (root / "ok.jpg", None),
        (None, "path escapes the source root ('..')"),
        (None, "path escapes the source root through a link"),
        (root / "sub", None),
        (None, "path escapes the source root through a link"),
        (None, "path escapes the source root ('..')"),
        (None, "absolute path (paths must be relative to the source root)"),
        (root / "ok.jpg", None),
    ]
