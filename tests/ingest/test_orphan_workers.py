"""``kill -9`` of ``stallfree ingest`` takes its worker processes with it (issue 10, item 14).

Before: the workers waited forever on their task queue under parent pid 1, 235 MB each.
"""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
from PIL import Image

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="kill -9 and fork are POSIX")


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie waiting for its new parent to reap it has ended)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _wait_until_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(pids)


def _kill_survivors(pids: list[int]) -> None:
    """End what this test started, if the fix failed (so a failing run leaks no processes)."""
    for pid in _alive(pids):
        psutil.Process(pid).kill()


@pytest.fixture
def busy_source(tmp_path: Path) -> Path:
    """Seconds of work for two workers in a few MB: 150 flat 3000x3000 JPEGs to decode fully and shrink."""
    buffer = io.BytesIO()
    Image.new("RGB", (3000, 3000), (10, 20, 30)).save(buffer, "JPEG")
    root = tmp_path / "src"
    for label in range(3):
        (root / f"c{label}").mkdir(parents=True)
        for i in range(50):
            (root / f"c{label}" / f"{i}.jpg").write_bytes(buffer.getvalue())
    return root


def _end(process: subprocess.Popen[Any], stream: IO[Any] | None, pids: list[int]) -> None:
    """Whatever the test found: kill the process it started, close its pipe, and kill any survivor it left."""
    if process.poll() is None:
        process.kill()
        process.wait(10)
    if stream is not None:
        stream.close()
    _kill_survivors(pids)


@pytest.mark.slow
def test_kill_9_of_ingest_ends_its_workers(busy_source: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; from stallfree.cli import main; sys.exit(main())", "ingest",
               str(busy_source), str(tmp_path / "out"), "--workers", "2", "--max-side", "32", "--validate"]
    parent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and parent.poll() is None and time.monotonic() < deadline:
            workers = [child.pid for child in psutil.Process(parent.pid).children()]
            time.sleep(0.05)
        assert len(workers) >= 2, f"the ingest never started its 2 workers (exit {parent.poll()})"
        time.sleep(0.5)  # let them take chunks: a busy worker must end too, not only an idle one
        assert parent.poll() is None, "the ingest ended before it could be killed: give it more work"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        survivors = _wait_until_gone(workers, 5)
        assert not survivors, f"workers {survivors} outlived the ingest killed with -9"
    finally:
        _end(parent, parent.stderr, workers)


def test_the_watchdog_alone_ends_an_orphan(tmp_path: Path) -> None:
    # Where prctl(PR_SET_PDEATHSIG) is missing or fails, the thread polling os.getppid() must end the worker.
    script = textwrap.dedent("""
        import os, sys, threading, time
        from stallfree.ingest.workers import _watch_parent

        parent = os.getpid()
        child = os.fork()
        if child == 0:  # the worker: the watchdog only, no parent-death signal
            threading.Thread(target=_watch_parent, args=(parent, 0.05), daemon=True).start()
            time.sleep(60)
            os._exit(0)
        print(child, flush=True)
        time.sleep(60)
    """)
    middle = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    orphan: list[int] = []
    try:
        assert middle.stdout is not None
        orphan = [int(middle.stdout.readline())]
        assert _alive(orphan), "the forked worker did not start"
        middle.send_signal(signal.SIGKILL)
        middle.wait(10)
        assert not _wait_until_gone(orphan, 5), f"the orphan {orphan} outlived its parent's kill -9"
    finally:
        _end(middle, middle.stdout, orphan)
