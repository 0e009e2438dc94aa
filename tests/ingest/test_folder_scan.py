"""One folder scanner: ingest and the Loader list an image folder's files in torchvision's order, links alike."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.ipc as ipc
import pytest

from stallfree.ingest.runner import ingest
from stallfree.pipeline.readers import FolderReader


def _tree(root: Path, png: bytes) -> None:
    # nested folders whose os.walk order (top-down) differs from sorted(os.walk) order (torchvision's)
    for rel in ["b/z.png", "b/a/y.png", "b/a/c/x.png", "b/a-1/w.png", "a/v.png"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(png)
    os.symlink(root / "b" / "a" / "c", root / "b" / "again")  # a second way into one folder: followed twice


def _torchvision_order(root: Path) -> list[str]:
    """torchvision's ImageFolder.make_dataset order, restated: sorted classes, sorted(os.walk), sorted names."""
    out = []
    for name in sorted(e.name for e in os.scandir(root) if e.is_dir()):
        for dirpath, _, files in sorted(os.walk(root / name, followlinks=True)):
            out += [os.path.relpath(os.path.join(dirpath, f), root) for f in sorted(files)]
    return out


def test_ingest_and_the_loader_list_a_folder_as_torchvision_does(tmp_path: Path, encode) -> None:
    root = tmp_path / "data"
    _tree(root, encode(0, fmt="PNG"))
    want = _torchvision_order(root)
    assert want.count("b/again/x.png") == 1 and len(want) == 6
    loader_order = [str(p.relative_to(root)) for p in FolderReader(root).paths]
    ingest(root, tmp_path / "out")
    shard = next((tmp_path / "out").glob("*.arrow"))
    keys = ipc.open_file(str(shard)).read_all().column("key").to_pylist()
    assert loader_order == want
    assert keys == want


def test_a_link_to_an_ancestor_is_refused_by_both(tmp_path: Path, encode) -> None:
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").write_bytes(encode(1, fmt="PNG"))
    os.symlink(root / "a", root / "a" / "loop")
    with pytest.raises(ValueError, match=r"a/loop is refused: folder link loops"):
        FolderReader(root)
    summary = ingest(root, tmp_path / "out")
    assert summary["rejected"] == 1 and summary["images"] == 1
