"""Crash safety: kill -9 part-way, run again, and get the same bytes as an uninterrupted run; parts and merge."""

import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from stallfree.ingest import runner
from stallfree.ingest.merge import merge
from stallfree.ingest.runner import ingest
from stallfree.ingest.verify import verify
from stallfree.ingest.writer import IngestOptions

OPTIONS = IngestOptions(shard_mb=0.002)  # about one image per shard: many shards to be killed between


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _slow_ingest(source: Path, out: Path) -> None:
    write = runner.write_shard

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return write(*args, **kwargs)

    runner.write_shard = slow  # this child process only
    ingest(source, out, OPTIONS)


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    ingest(folder, out, OPTIONS)
    return out


def test_kill_9_then_rerun_gives_the_same_shards(folder, reference, tmp_path):
    out = tmp_path / "out"
    # spawn, not fork: a fork of this process (DALI's and torch's threads running) can die of SIGSEGV on its own
    child = multiprocessing.get_context("spawn").Process(target=_slow_ingest, args=(folder, out))
    child.start()
    deadline = time.monotonic() + 60
    while len(list((out / ".ingest").glob("shard-*.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert not (out / "manifest.json").exists(), "the ingest finished before the kill: make the data larger"
    last = max(name for name in files(reference) if name.startswith("shard-"))
    (out / f".{last}.tmp").write_bytes(b"half a shard")  # as if killed mid-write
    summary = ingest(folder, out, OPTIONS)
    assert summary["resumed_shards"] >= 3 and summary["written_shards"] >= 1
    assert files(out) == files(reference)
    assert verify(out) == []
    again = ingest(folder, out, OPTIONS)  # a finished ingest run again does nothing and changes nothing
    assert again["written_shards"] == 0 and files(out) == files(reference)


def test_other_options_in_the_same_folder_are_refused(folder, reference, tmp_path):
    out = tmp_path / "out"
    ingest(folder, out, OPTIONS)
    with pytest.raises(ValueError, match="unfinished ingest of a different source or options"):
        ingest(folder, out, IngestOptions(shard_mb=0.002, quality=50))


def test_parts_then_merge_equal_one_run(folder, tmp_path, encode):
    source = tmp_path / "src"
    shutil.copytree(folder, source)
    for name in ("circle/bad.jpg", "square/bad.jpg", "triangle/bad.jpg"):  # rejections in several shards
        (source / name).write_bytes(b"not an image")
    os.symlink(tmp_path, source / "circle" / "up.jpg")  # and one from the listing
    reference = tmp_path / "reference"
    ingest(source, reference, OPTIONS)
    out = tmp_path / "out"
    for i in range(3):
        ingest(source, out, OPTIONS, part=(i, 3))
    assert not (out / "manifest.json").exists()
    summary = merge(out)
    assert summary["parts"] == 3 and summary["rejected"] == 4
    mine = {k: v for k, v in files(out).items() if not k.startswith("manifest.part-")}
    assert mine == files(reference) and "labels.npy" in mine  # the merge writes the labels of a single run


def test_merge_refuses_missing_parts(folder, tmp_path):
    ingest(folder, tmp_path, OPTIONS, part=(1, 3))
    with pytest.raises(ValueError, match=r"expected parts 0..2 of 3"):
        merge(tmp_path)


def test_two_workers_write_what_one_writes(folder, reference, tmp_path):
    ingest(folder, tmp_path / "out", OPTIONS, workers=2)
    assert files(tmp_path / "out") == files(reference)
