"""Crash safety: kill -9 part-way, run again, and get the same bytes as an uninterrupted run; parts and merge."""

import json
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


def _slow_ingest(source: Path, out: Path, part: tuple[int, int] = (0, 1)) -> None:
    write = runner.write_shard

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return write(*args, **kwargs)

    runner.write_shard = slow  # this child process only
    ingest(source, out, OPTIONS, part=part)


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    ingest(folder, out, OPTIONS)
    return out


def _kill_9_after(records: int, folder: Path, out: Path, part: tuple[int, int] = (0, 1)) -> None:
    """Run ingest's ``part`` in a child process and ``kill -9`` it once ``records`` of its shards are written."""
    # spawn, not fork: a fork of this process (DALI's and torch's threads running) can die of SIGSEGV on its own
    child = multiprocessing.get_context("spawn").Process(target=_slow_ingest, args=(folder, out, part))
    child.start()
    pattern = "shard-*.json" if part == (0, 1) else f"shard-{part[0]}-of-{part[1]}-*.json"
    deadline = time.monotonic() + 60
    while len(list((out / ".ingest").glob(pattern))) < records and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL


@pytest.mark.slow
def test_kill_9_then_rerun_gives_the_same_shards(folder, reference, tmp_path):
    out = tmp_path / "out"
    _kill_9_after(3, folder, out)
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
    with pytest.raises(ValueError, match="holds a finished ingest of a different source or options"):
        ingest(folder, out, IngestOptions(shard_mb=0.002, quality=50))
    (out / "manifest.json").unlink()  # as a run killed before its manifest leaves it
    with pytest.raises(ValueError, match="holds an unfinished ingest of a different source or options"):
        ingest(folder, out, IngestOptions(shard_mb=0.002, quality=50))


def test_parts_then_merge_hold_one_runs_samples_in_its_order(folder, tmp_path, shard_rows):
    source = tmp_path / "src"
    shutil.copytree(folder, source)
    for name in ("circle/bad.jpg", "square/bad.jpg", "triangle/bad.jpg"):  # rejections in several shards
        (source / name).write_bytes(b"not an image")
    os.symlink(tmp_path, source / "circle" / "up.jpg")  # and one from the listing
    reference = tmp_path / "reference"
    ingest(source, reference, OPTIONS)
    out = tmp_path / "out"
    for i in (2, 0, 1):  # in any order
        ingest(source, out, OPTIONS, part=(i, 3))
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in out.glob("shard-0-of-3-*.arrow"))  # each part names its own shards
    summary = merge(out)
    assert summary["parts"] == 3 and summary["rejected"] == 4
    assert shard_rows(out) == shard_rows(reference)  # same samples, bytes, labels and keys, in the same order
    for name in ("rejected.jsonl", "labels.npy"):
        assert (out / name).read_bytes() == (reference / name).read_bytes()
    merged, one = (json.loads((o / "manifest.json").read_text()) for o in (out, reference))
    for key in ("classes", "class_counts", "rows", "source_bytes", "rejected", "schema", "image", "options"):
        assert merged[key] == one[key], key
    assert merged["plan"]["job"] != one["plan"]["job"]  # the split is part of the job
    assert verify(out) == []
    assert merge(out) == summary  # a merge run again changes nothing


def test_a_part_lists_only_its_own_classes(folder, tmp_path, monkeypatch):
    from stallfree.ingest import sources

    sized: list[str] = []
    getsize = os.path.getsize
    monkeypatch.setattr(sources.os.path, "getsize", lambda path: sized.append(str(path)) or getsize(path))
    plan = sources.plan_source(folder, part=(1, 3))
    assert plan.classes == ["circle", "square", "triangle"] and plan.units == 3
    assert {item.label for item in plan.items} == {1} and len(sized) == len(plan.items) == 6
    assert all("/square/" in path for path in sized)


def test_a_part_refuses_a_folder_split_another_way(folder, tmp_path):
    ingest(folder, tmp_path, OPTIONS, part=(0, 2))
    with pytest.raises(ValueError, match=r"unfinished ingest split 2 way\(s\) \(plan.part-0-of-2.json\), not 3"):
        ingest(folder, tmp_path, OPTIONS, part=(1, 3))
    with pytest.raises(ValueError, match="split 2 way"):
        ingest(folder, tmp_path, OPTIONS)


def test_parts_of_different_jobs_are_refused(folder, tmp_path):
    ingest(folder, tmp_path, OPTIONS, part=(0, 2))
    with pytest.raises(ValueError, match="unfinished ingest of a different source or options"):
        ingest(folder, tmp_path, IngestOptions(shard_mb=0.002, quality=50), part=(1, 2))
    (tmp_path / ".ingest" / "plan.part-0-of-2.json").unlink()  # so that other options may write part 1 here
    ingest(folder, tmp_path, IngestOptions(shard_mb=0.002, quality=50), part=(1, 2))
    with pytest.raises(ValueError, match="different sources or options"):
        merge(tmp_path)


def test_a_part_killed_then_rerun_merges_into_one_runs_samples(folder, reference, tmp_path, shard_rows):
    out = tmp_path / "out"
    ingest(folder, out, OPTIONS, part=(0, 2))
    _kill_9_after(2, folder, out, (1, 2))
    assert not (out / "manifest.part-1-of-2.json").exists(), "the part finished before the kill: make the data larger"
    summary = ingest(folder, out, OPTIONS, part=(1, 2))
    assert summary["resumed_shards"] >= 2 and summary["written_shards"] >= 1
    merge(out)
    assert shard_rows(out) == shard_rows(reference) and verify(out) == []


def test_merge_refuses_missing_parts(folder, tmp_path):
    ingest(folder, tmp_path, OPTIONS, part=(1, 3))
    with pytest.raises(ValueError, match=r"expected parts 0..2 of 3"):
        merge(tmp_path)


def test_two_workers_write_what_one_writes(folder, reference, tmp_path):
    ingest(folder, tmp_path / "out", OPTIONS, workers=2)
    assert files(tmp_path / "out") == files(reference)
