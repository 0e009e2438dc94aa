"""The one atomic write: absent or complete, flushed to disk, never a stray temporary file."""

import os
from pathlib import Path

import pytest

from stallfree.core import atomic
from stallfree.core.atomic import atomic_path, atomic_write


def test_write_replaces_the_file_and_flushes_file_and_folder(tmp_path: Path, monkeypatch) -> None:
    synced: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(atomic.os, "fsync", record)
    target = tmp_path / "sub" / "meta.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert [Path(p).name for p in synced[-2:]] == [Path(synced[-2]).name, "sub"]
    assert synced[-2].startswith(str(tmp_path / "sub" / ".meta.json.tmp-"))
    assert sorted(p.name for p in target.parent.iterdir()) == ["meta.json"]


def test_a_cache_write_is_atomic_without_flushing(tmp_path: Path, monkeypatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(atomic.os, "fsync", synced.append)
    target = tmp_path / "cache" / "abc.arrow"
    with atomic_path(target, durable=False) as tmp:
        tmp.write_bytes(b"shard")
        assert not target.exists()  # a reader sees nothing until the rename
    assert target.read_bytes() == b"shard"
    assert synced == []
    assert sorted(p.name for p in target.parent.iterdir()) == ["abc.arrow"]


@pytest.mark.parametrize("durable", [True, False])
def test_a_failed_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "shard.arrow"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="writer died"), atomic_path(target, durable=durable) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard.arrow"]


@pytest.mark.parametrize("writer", ["clock", "checkpoint"])
def test_every_writer_goes_through_it(tmp_path: Path, monkeypatch, writer: str) -> None:
    written: list[str] = []
    real = atomic._fsync_file

    def spy(tmp: Path) -> None:
        written.append(tmp.name.split(".tmp-")[0])
        real(tmp)

    monkeypatch.setattr(atomic, "_fsync_file", spy)
    if writer == "clock":
        from stallfree.stage_runtime.clock import StageClock

        StageClock().dump(tmp_path / "spans.json")
        assert written == [".spans.json"]
    else:
        from stallfree.stage_runtime.train import checkpoint as checkpoint

        checkpoint.save_rank(tmp_path, 3, 0, {"x": 1})
        assert written == [".rank-0.pt"]
