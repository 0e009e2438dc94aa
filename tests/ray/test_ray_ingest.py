"""``stallfree ingest --ray``: the parts as Ray tasks on a real two-node cluster, merged as a one-part ingest.

Faults are real ones: a task's worker process killed with SIGKILL, a part's lock held by another process, the driver
killed with SIGKILL. The source has two small classes and a large one, one image per shard, so that the last part
is still writing when the first two are done (or, where the test needs it, waits for a lock the test holds).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from stallfree.ingest.lock import ingest_lock
from stallfree.ingest.ray_ingest import PartFailed, ingest_on_ray
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import RECORDS, IngestOptions

pytestmark = pytest.mark.ray

OPTIONS = IngestOptions(shard_mb=0.001)  # one 24x24 PNG (about 1.8 kB) per shard: many shards to be killed between
CLASSES = {"a": 5, "b": 5, "c": 200}  # parts of 3: one class each; part 2 takes seconds, parts 0 and 1 a moment
BAD = ("a/bad.png", "c/bad.png")  # rejected in the shards of two parts


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-ingest") / "src"
    rng = np.random.default_rng(38)
    for name, count in CLASSES.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(root / name / f"{i:03d}.png")
    for bad in BAD:
        (root / bad).write_bytes(b"not an image")
    return root


@pytest.fixture(scope="module")
def reference(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local ingest of one part: what every Ray ingest must equal."""
    out = tmp_path_factory.mktemp("reference")
    ingest(source, out, OPTIONS)
    return out


def rows(out: Path) -> list[dict[str, Any]]:
    """Every row of ``out``'s shards, in the manifest's order."""
    import pyarrow as pa

    manifest = json.loads((out / "manifest.json").read_text())
    found: list[dict[str, Any]] = []
    for shard in manifest["shards"]:
        with pa.memory_map(str(out / shard["file"])) as f:
            found += pa.ipc.open_file(f).read_all().to_pylist()
    return found


def assert_same_dataset(out: Path, reference: Path) -> None:
    assert rows(out) == rows(reference)  # samples, bytes, labels, keys, in the same order
    for name in ("labels.npy", "rejected.jsonl"):
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
    merged, one = (json.loads((o / "manifest.json").read_text()) for o in (out, reference))
    for key in ("classes", "class_counts", "rows", "source_bytes", "rejected", "schema", "image", "options"):
        assert merged[key] == one[key], key


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stallfree", "ingest", *args, "--shard-size", "0.001", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(child: subprocess.Popen[str]) -> dict[str, Any]:
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr
    return dict(json.loads(stdout))


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def records(out: Path, part: int) -> int:
    return len(list((out / RECORDS).glob(f"shard-{part}-of-3-*.json")))


@contextlib.contextmanager
def in_thread(call: Callable[[], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Run ``call`` in a thread for the ``with`` block; its result fills the yielded dict at the block's end."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as err:  # handed to the test below, which raises it
            result["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield result
    finally:
        thread.join(timeout=120)
    assert not thread.is_alive()
    if "error" in result:
        raise result["error"]


def test_ingest_on_ray_equals_a_local_ingest(ray_connected: str, source: Path, reference: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    summary = ingest_on_ray(source, tmp_path, OPTIONS, progress=True)
    assert summary["parts"] == 3  # the cluster's CPUs
    assert summary["address"] == ray_connected and summary["rejected"] == len(BAD)
    assert summary["written_shards"] == summary["shards"] and summary["resumed_shards"] == 0
    assert_same_dataset(tmp_path, reference)
    samples = summary["images"] + summary["rejected"]
    bar = capsys.readouterr().err
    assert f"{samples}/{samples}" in bar and "3/3 parts done" in bar  # the bar counted every task's samples
    again = ingest_on_ray(source, tmp_path, OPTIONS)  # finished: every part finds its shards done
    assert again["written_shards"] == 0 and again["resumed_shards"] == summary["shards"]
    assert_same_dataset(tmp_path, reference)


def test_one_part_is_a_one_part_ingest_and_a_rerun_keeps_its_split(ray_connected: str, source: Path,
                                                                     reference: Path, tmp_path: Path) -> None:
    summary = ingest_on_ray(source, tmp_path, OPTIONS, parts=1)
    assert summary["parts"] == 1 and summary["written_shards"] == summary["shards"]
    files = {p.name: p.read_bytes() for p in sorted(reference.iterdir()) if p.is_file()}
    assert {p.name: p.read_bytes() for p in sorted(tmp_path.iterdir()) if p.is_file()} == files  # byte for byte
    again = ingest_on_ray(source, tmp_path, OPTIONS)  # not the cluster's 3 parts: the one OUT holds, resumed
    assert again["parts"] == 1 and again["written_shards"] == 0


def test_the_cli_with_an_address_equals_a_local_ingest(ray_connected: str, source: Path, reference: Path,
                                                       tmp_path: Path) -> None:
    summary = finished(cli(str(source), str(tmp_path), "--ray", ray_connected, "--parts", "2"))
    assert summary["parts"] == 2 and summary["address"] == ray_connected
    assert [p["part"] for p in summary["part_summaries"]] == ["0/2", "1/2"]
    assert_same_dataset(tmp_path, reference)


def test_an_out_at_a_url_is_uploaded_by_the_tasks_and_merged_there(ray_connected: str, source: Path,
                                                                     reference: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    summary = ingest_on_ray(source, store.as_uri(), OPTIONS, parts=3)  # each task stages its part in its node's cache
    assert summary["uploaded_shards"] == summary["shards"] and summary["url"] == store.as_uri()
    assert_same_dataset(store, reference)
    shared, staging = tmp_path / "shared", tmp_path / "staging"  # one staging folder for every part, kept
    first = ingest_on_ray(source, shared.as_uri(), OPTIONS, parts=3, staging=staging)
    again = ingest_on_ray(source, shared.as_uri(), OPTIONS, parts=3, staging=staging)
    assert first["uploaded_shards"] == first["shards"] and again["written_shards"] == 0
    assert again["uploaded_shards"] == 0 and again["stored_shards"] == first["shards"]
    assert_same_dataset(shared, reference)


def test_a_task_whose_process_is_killed_is_run_again_and_resumes(ray_connected: str, source: Path, reference: Path,
                                                                 tmp_path: Path) -> None:
    lock = tmp_path / RECORDS / "lock.part-2-of-3.json"
    with in_thread(lambda: ingest_on_ray(source, tmp_path, OPTIONS, parts=3)) as result:
        wait_for(lambda: records(tmp_path, 2) >= 3, "part 2's first shards")
        pid = json.loads(lock.read_text())["pid"]  # the task's worker process, which holds the part's lock
        os.kill(pid, signal.SIGKILL)
        assert not (tmp_path / "manifest.part-2-of-3.json").exists(), "part 2 finished before the kill: enlarge it"
    part = result["value"]["part_summaries"][2]
    assert part["resumed_shards"] >= 3 and part["written_shards"] >= 1  # run again by Ray, after the shards done
    assert_same_dataset(tmp_path, reference)


def test_a_part_refused_once_is_tried_again(ray_connected: str, source: Path, reference: Path, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="stallfree.ingest.ray_ingest")
    with in_thread(lambda: ingest_on_ray(source, tmp_path, OPTIONS, parts=3, tries=5, backoff=1.0)) as result:
        with ingest_lock(tmp_path, tmp_path / RECORDS, "the test", (1, 3)):  # as a stopping task would hold it
            wait_for(lambda: any("part 1/3: try 1 of 5 failed (FolderLocked" in r.getMessage()
                                 for r in caplog.records), "part 1's refused try")
    assert result["value"]["part_summaries"][1]["tries"] >= 2  # 3 where the warnings came late (actor starting)
    assert_same_dataset(tmp_path, reference)


def test_a_part_that_keeps_failing_stops_the_ingest_naming_it(ray_connected: str, source: Path, reference: Path,
                                                              tmp_path: Path) -> None:
    with ingest_lock(tmp_path, tmp_path / RECORDS, "the test", (1, 3)):
        with pytest.raises(PartFailed, match=r"part 1/3 of the ingest of .* failed after 2 tries: FolderLocked: "
                                             r".* is being written by stallfree ingest pid \d+ .* of the test --part "
                                             r"1/3.*run the same command again to resume"):
            ingest_on_ray(source, tmp_path, OPTIONS, parts=3, tries=2, backoff=0.1)
    assert not (tmp_path / "manifest.json").exists()
    ingest_on_ray(source, tmp_path, OPTIONS, parts=3)  # the same call, once the part is free, resumes and merges
    assert_same_dataset(tmp_path, reference)


def test_bad_arguments_are_refused_with_the_fix(ray_connected: str, source: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.cli import main

    with pytest.raises(ValueError, match=r"each task asks for 3 CPUs \(--workers\), but the largest node of the Ray "
                                         r"cluster has 2; ask for 2 or fewer"):
        ingest_on_ray(source, tmp_path, OPTIONS, cpus_per_task=3)
    with pytest.raises(ValueError, match="parts must be an int >= 1, got 0"):
        ingest_on_ray(source, tmp_path, OPTIONS, parts=0)
    for args, message in (([str(source), str(tmp_path), "--ray", "--part", "0/2"], "drop --merge and --part"),
                          ([str(tmp_path), "--ray", "--merge"], "drop --merge and --part"),
                          ([str(source), str(tmp_path), "--parts", "2"], "--parts applies to --ray")):
        assert main(["ingest", *args]) == 2
        assert message in capsys.readouterr().err


def test_an_address_where_no_cluster_answers_is_named(source: Path, tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        child = cli(str(source), str(tmp_path), "--ray", address)
        _, stderr = child.communicate(timeout=60)
    assert child.returncode == 1
    assert f"stallfree ingest: error: no Ray cluster answers at {address} (Connection refused)" in stderr


def test_a_rerun_after_kill_9_of_the_driver_resumes_without_redoing_finished_parts(
        ray_connected: str, source: Path, reference: Path, tmp_path: Path) -> None:
    args = (str(source), str(tmp_path), "--ray", ray_connected, "--parts", "3")
    # part 2's lock held here: its task waits between tries, unfinished, while parts 0 and 1 finish
    with ingest_lock(tmp_path, tmp_path / RECORDS, "the test", (2, 3)):
        driver = cli(*args)
        try:
            wait_for(lambda: all((tmp_path / f"manifest.part-{i}-of-3.json").exists() for i in (0, 1))
                     or driver.poll() is not None, "parts 0 and 1")
            assert driver.poll() is None, driver.communicate()
        finally:
            driver.kill()
            driver.communicate()
    assert driver.returncode == -signal.SIGKILL
    done = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for i in (0, 1) for p in tmp_path.glob(f"shard-{i}-of-3-*")}
    summary = finished(cli(*args))
    for i in (0, 1):
        part = summary["part_summaries"][i]
        assert part["written_shards"] == 0 and part["resumed_shards"] == part["shards"] > 0, part
    last = summary["part_summaries"][2]
    assert last["written_shards"] == last["shards"] > 0 and last["tries"] == 1, last
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in done} == done  # not written again
    assert_same_dataset(tmp_path, reference)
