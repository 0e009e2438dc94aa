"""A slow store is not a stalled one, and neither keeps the program from ending (issue #37, case 6).

Bytes are counted as they arrive, so a steady slow link never reads as "no byte for N s"; Ctrl-C and the end of the
program cancel the downloads in flight. The store is the HTTP range server behind the fault proxy on 127.0.0.1,
which trickles replies; the program is a child process, timed from the signal (or its last line) to its exit.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stallfree.bench.servers import FaultProxy, RangeServer
from stallfree.ingest.fetch import Progress
from stallfree.ingest.remote import Retry, open_store
from stallfree.ingest.transfer import download
from stallfree.pipeline.shard_cache import ShardCache

pytestmark = pytest.mark.slow  # each test runs the Loader in a child process and times its end

#: The issue asks for 5 s; the bound is generous for a loaded 2-core machine, and far below "never".
EXIT_BOUND = 15.0


def test_a_steady_slow_link_is_not_a_stall(tmp_path: Path) -> None:
    # was: "no byte for 11 s" over a steady 150 KB/s link: the counter moved once per finished 8 MiB piece
    blob = os.urandom(400_000)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "blob.bin").write_bytes(blob)
    sha256 = hashlib.sha256(blob).hexdigest()
    retry = Retry(attempts=1, timeout=1.0, max_backoff=0.25)  # the reader's watchdog: no byte for 2.25 s
    with RangeServer(tmp_path / "store") as server, FaultProxy(server.url, bandwidth=100_000.0) as proxy:
        url = f"{proxy.url}/blob.bin"  # 4 s at 100 KB/s, in steady writes
        fs, path = open_store(url, {}, retry.timeout)

        def fetch(sha: str, dest: Path, progress: Progress) -> None:
            download(fs, path, url, dest, len(blob), sha, retry, progress)

        cache = ShardCache(tmp_path / "cache", None, 1, retry)
        got = cache.acquire(sha256, len(blob), fetch, "blob.bin")
        assert got.read_bytes() == blob
        cache.release(sha256)


_CHILD = textwrap.dedent("""
    import sys
    from stallfree import Loader
    from stallfree.transforms import Normalize, RandomResizedCrop

    url, cache, mode = sys.argv[1:]
    loader = Loader(url, 4, transform=[RandomResizedCrop(12), Normalize()], cache_dir=cache, shuffle=False,
                    remote_timeout=30.0)
    print("ready", flush=True)
    try:
        for batch in loader:
            pass
    except Exception as err:  # the store's error (a missing shard): the program goes on to its end
        print("failed:", type(err).__name__, err, flush=True)
    if mode == "end":
        sys.stdin.readline()  # the test's go: the next shard's download is under way (on a loaded machine, later)
    print("end", flush=True)
""")


def _child(tmp_path: Path, url: str, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    return subprocess.Popen([sys.executable, str(script), url, str(tmp_path / "cache"), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _wait_line(child: subprocess.Popen[str], prefix: str) -> str:
    assert child.stdout is not None
    for line in child.stdout:  # the child prints within a minute even on a loaded machine; else the test's timeout
        if line.startswith(prefix):
            return line
    raise AssertionError(f"the child ended without printing {prefix!r} (exit code {child.wait()})")


def _exit_time(child: subprocess.Popen[str], since: float) -> float:
    try:
        child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return float("inf")
    return time.monotonic() - since


def _ctrl_c(child: subprocess.Popen[str], trickling: Callable[[], bool]) -> float:
    """Seconds from Ctrl-C to the child's end, sent once it is ready and a second after ``trickling()`` holds."""
    try:
        _wait_line(child, "ready")
        deadline = time.monotonic() + 60
        while not trickling() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        return _exit_time(child, sent)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_ctrl_c_over_a_trickling_store_ends_the_program(http_server: RangeServer, tmp_path: Path) -> None:
    # was: SIGINT mid-epoch took 15 s over a 300 KB/s store and never returned over a 50 B/s one
    with FaultProxy(http_server.url) as proxy:
        proxy.inject("trickle", count=10**6, match=".arrow", rate=50.0)
        took = _ctrl_c(_child(tmp_path, proxy.url, "sigint"),
                       lambda: any(".arrow" in line for line in proxy.seen))  # a shard's download is under way
    assert took < EXIT_BOUND, f"the program took {took:.1f} s to end after Ctrl-C"


def _png(seed: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.full((6, 5, 3), seed, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def test_ctrl_c_over_tars_trickled_by_range_ends_the_program(tmp_path: Path, write_tar: Any) -> None:
    # a read waiting for its range's fetch ahead (up to remote_timeout) must not hold the exit either
    from stallfree.pipeline.webdataset import WebDatasetReader

    (tmp_path / "tars").mkdir()
    for t in range(2):
        write_tar(tmp_path / "tars" / f"t-{t}.tar", [member for i in range(8) for member in (
            (f"s{t}{i}.png", _png(t * 8 + i)), (f"s{t}{i}.cls", b"%d" % (t * 8 + i)))])
    with RangeServer(tmp_path / "tars") as server, FaultProxy(server.url) as proxy:
        url = f"{proxy.url}/t-{{0..1}}.tar"
        WebDatasetReader(url, cache_dir=tmp_path / "cache").close()  # indexed now: the child reads the index
        proxy.inject("trickle", count=10**6, match=".tar", rate=50.0)  # GETs only: the child's HEADs answer
        took = _ctrl_c(_child(tmp_path, url, "sigint"), lambda: bool(proxy.met))  # the ranged reads are trickling
    assert took < EXIT_BOUND, f"the program took {took:.1f} s to end after Ctrl-C"


def test_the_end_of_the_program_ends_a_trickling_download(http_server: RangeServer, tmp_path: Path) -> None:
    # was: after a shard's error, a download still trickling kept the interpreter from exiting
    with FaultProxy(http_server.url) as proxy:
        proxy.inject("404", count=10**6, match="shard-00000.arrow")
        proxy.inject("trickle", count=10**6, match=".arrow", rate=50.0)
        child = _child(tmp_path, proxy.url, "end")
        try:
            assert "shard-00000.arrow" in _wait_line(child, "failed:")
            deadline = time.monotonic() + 60
            while not any("shard-00001.arrow" in line for line in proxy.seen) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            _wait_line(child, "end")
            took = _exit_time(child, time.monotonic())
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert took < EXIT_BOUND, f"the program took {took:.1f} s to end after its last line"
    assert any("shard-00001.arrow" in line for line in proxy.seen)  # a download was trickling as it ended
