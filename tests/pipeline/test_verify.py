"""Checksum verification as a choice (issue 16): first-use, open or none, and the verified-once marker."""

import json
import os
import shutil
from pathlib import Path

import pytest

from stallfree import Loader
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions
from stallfree.pipeline.samples import BadSampleError
from stallfree.pipeline.shards import ShardError
from stallfree.transforms import CenterCrop


@pytest.fixture
def shards(indexed_list: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path / "cache"))
    ingest(indexed_list, tmp_path / "shards", IngestOptions(shard_mb=0.01))
    return tmp_path / "shards"


def make(source: Path, **kwargs) -> Loader:
    return Loader(source, 8, transform=[CenterCrop(12)], shuffle=False, num_threads=1, **kwargs)


def flip_a_byte(shard: Path, keep_mtime: bool) -> None:
    before = shard.stat()
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01  # inside the image bytes: only the checksum sees it
    shard.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))


def markers(cache: Path) -> list[Path]:
    """The shards' verified-once markers (not that of labels.npy, hashed on construction)."""
    found = sorted((cache / "verified").glob("*.json")) if (cache / "verified").is_dir() else []
    return [m for m in found if json.loads(m.read_text())["path"].endswith(".arrow")]


def test_open_hashes_every_shard_at_construction(shards: Path) -> None:
    shard = sorted(shards.glob("shard-*.arrow"))[-1]
    flip_a_byte(shard, keep_mtime=False)
    with pytest.raises(ShardError, match=rf"{shard.name}: SHA-256 differs from the manifest's"):
        make(shards, verify="open")


def test_first_use_hashes_on_the_first_read_and_marks_the_shard(shards: Path, tmp_path: Path) -> None:
    count = len(list(shards.glob("shard-*.arrow")))
    loader = make(shards)
    assert markers(tmp_path / "cache") == [], "nothing is hashed before a read"
    list(loader)
    assert len(markers(tmp_path / "cache")) == count, "one marker per verified shard"


def test_a_marked_shard_is_not_hashed_again_until_it_changes(shards: Path) -> None:
    list(make(shards, verify="open"))
    shard = sorted(shards.glob("shard-*.arrow"))[1]
    flip_a_byte(shard, keep_mtime=True)  # what the marker cannot see: same size, same modification time
    make(shards, verify="open")  # "open" hashes at construction, unless the marker is trusted: no error
    os.utime(shard)  # a new modification time: the marker no longer applies
    with pytest.raises(BadSampleError, match=rf"{shard.name} row \d+ .*SHA-256 differs"):
        list(make(shards))


def test_none_never_hashes(shards: Path, tmp_path: Path) -> None:
    flip_a_byte(sorted(shards.glob("shard-*.arrow"))[0], keep_mtime=False)
    loader = make(shards, verify="none", on_error="skip")
    list(loader)
    assert loader.skipped and not any("SHA-256" in s["reason"] for s in loader.skipped), "only the decoder saw it"
    assert markers(tmp_path / "cache") == []


def test_a_copy_is_verified_on_its_own(shards: Path, tmp_path: Path) -> None:
    list(make(shards))
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    shard = sorted(copy.glob("shard-*.arrow"))[0]
    flip_a_byte(shard, keep_mtime=False)
    with pytest.raises(BadSampleError, match=rf"{shard.name} row \d+ .*SHA-256 differs"):
        list(make(copy))


def test_an_unwritable_cache_warns_and_still_verifies(shards: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    with pytest.warns(RuntimeWarning, match=r"could not record that .*shard-\d+\.arrow was verified.*"
                                            r"set STALLFREE_CACHE_DIR"):
        list(make(shards, verify="open"))


def test_a_bad_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"verify must be one of \('first-use', 'open', 'none'\), got 'lazy'"):
        Loader("unused", 8, verify="lazy")  # type: ignore[arg-type]
