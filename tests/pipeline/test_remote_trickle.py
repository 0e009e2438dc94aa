"""A store that trickles bytes fails by a minimum rate over a window; a steady slow link does not (issue 44, item 8).

``remote_timeout`` counts seconds without a byte, so a server sending one byte a second held the job as long as it
liked. ``remote_min_rate`` bytes/s averaged over ``remote_rate_window`` seconds (curl's ``--speed-limit`` and
``--speed-time``) ends it. The store is the HTTP range server behind the fault proxy on 127.0.0.1 (trickling, or
capped to a steady rate); each test sets a window of a second or so, so that it runs in a few seconds.
"""

from __future__ import annotations

import io
import queue
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader, RemoteStoreError
from stallfree.bench.servers import FaultProxy, RangeServer
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions
from stallfree.transforms import Normalize, RandomResizedCrop

SPEC = [RandomResizedCrop(12), Normalize()]
#: As test_remote_stall_exit's: generous for a loaded 2-core machine, and far below "never".
EXIT_BOUND = 15.0


def test_a_trickled_shard_fails_naming_the_url_the_rate_and_the_window(http_proxy: FaultProxy,
                                                                       tmp_path: Path) -> None:
    # was: at 1 byte/s no error ever came (remote_timeout counts seconds without a byte)
    http_proxy.inject("trickle", count=10**6, match=".arrow", rate=1.0)
    loader = Loader(http_proxy.url, 4, transform=SPEC, cache_dir=tmp_path, shuffle=False, retries=1,
                    remote_timeout=30.0, remote_min_rate=1024, remote_rate_window=1.0)
    with pytest.raises(RemoteStoreError, match=r"http://127\.0\.0\.1:\d+/shard-\d+\.arrow: 1 tries failed \(the last: "
                                               r"TooSlow: \d+ bytes in the last [\d.]+ s, under remote_min_rate=1024 "
                                               r"bytes/s averaged over remote_rate_window=1 s"):
        list(loader)
    loader.close()


@pytest.mark.slow
def test_a_trickled_tar_fails_naming_the_tar_the_rate_and_the_window(tmp_path: Path, write_tar: Any) -> None:
    # the read-ahead's ranged requests (fetch_ranges) and a sample's own read both keep to the rate
    folder = tmp_path / "tars"
    folder.mkdir()
    write_tar(folder / "a.tar", [m for i in range(8) for m in ((f"s{i}.png", _png(i)), (f"s{i}.cls", b"%d" % i))])
    with RangeServer(folder) as server, FaultProxy(server.url) as proxy:
        url = f"{proxy.url}/a.tar"
        keywords: dict[str, Any] = {"transform": SPEC, "cache_dir": tmp_path / "index", "retries": 1,
                                    "remote_timeout": 30.0, "remote_min_rate": 1024, "remote_rate_window": 1.0}
        loader = Loader(url, 4, **keywords)  # indexed before the trickle
        proxy.inject("trickle", count=10**6, match=".tar", rate=1.0)  # GETs only: the HEADs answer
        with pytest.raises(RemoteStoreError, match=r"http://127\.0\.0\.1:\d+/a\.tar: 1 tries failed \(the last: "
                                                   r"TooSlow: .* under remote_min_rate=1024 bytes/s averaged over "
                                                   r"remote_rate_window=1 s"):
            list(loader)
        loader.close()


def _png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((6, 5, 3), seed, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def large_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 noise PNGs of 96x96 (about 28 KB each), label = index, in shards of about 110 KB."""
    root = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(0)
    lines = ["path,label"]
    for i in range(12):
        Image.fromarray(rng.integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(root / f"{i}.png")
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    ingest(root / "list.csv", root / "ds", IngestOptions(shard_mb=0.1))
    return root / "ds"


def test_a_steady_slow_link_above_the_rate_is_not_stalled(large_shards: Path, tmp_path: Path) -> None:
    # 150 KB/s, steady, against a minimum of 30 KB/s over 0.5 s: each shard takes longer than the window to arrive,
    # so the rate is judged on every one, and it is five times the minimum
    sizes = [p.stat().st_size for p in large_shards.glob("shard-*.arrow")]
    assert len(sizes) >= 3 and min(sizes) > 150_000 * 0.5
    with RangeServer(large_shards) as server, FaultProxy(server.url, bandwidth=150_000.0) as proxy:
        loader = Loader(proxy.url, 4, transform=SPEC, cache_dir=tmp_path, shuffle=False, retries=1,
                        remote_min_rate=30_000, remote_rate_window=0.5)
        assert sorted(torch.cat([b[1] for b in loader]).tolist()) == list(range(12))
        loader.close()


def test_the_rate_keywords_are_checked(remote_data: Path) -> None:
    with pytest.raises(ValueError, match=r"remote_min_rate must be a number of bytes per second >= 0"):
        Loader("http://127.0.0.1:9/", 4, transform=SPEC, remote_min_rate=-1)
    with pytest.raises(ValueError, match=r"remote_rate_window must be a positive number of seconds, got 0"):
        Loader("http://127.0.0.1:9/", 4, transform=SPEC, remote_rate_window=0)
    with pytest.raises(ValueError, match=r"remote_min_rate=.* apply to a dataset at a URL"):
        Loader(remote_data, 4, transform=SPEC, remote_min_rate=10)


_CHILD = textwrap.dedent("""
    import sys
    from stallfree import Loader
    from stallfree.transforms import Normalize, RandomResizedCrop

    url, cache = sys.argv[1:]
    loader = Loader(url, 4, transform=[RandomResizedCrop(12), Normalize()], cache_dir=cache, shuffle=False,
                    retries=1, remote_timeout=30.0, remote_min_rate=1024, remote_rate_window=1.0)
    try:
        for batch in loader:
            pass
    except Exception as err:
        print("failed:", type(err).__name__, err, flush=True)
    print("end", flush=True)
""")


def _lines(child: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """The child's lines as they come (``None`` at its end), read by a thread: a test may wait with a bound."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _line(lines: queue.Queue[str | None], prefix: str, within: float) -> str:
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            raise AssertionError(f"the child ended without printing {prefix!r}")
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no {prefix!r} from the child within {within:g} s: the trickle held it")


@pytest.mark.slow
def test_the_program_ends_promptly_after_a_trickle_error(http_proxy: FaultProxy, tmp_path: Path) -> None:
    # was: the error came only when the trickling server closed (60 s); every shard's download trickles here, so
    # the read-ahead's downloads are still in flight when the error reaches the program
    http_proxy.inject("trickle", count=10**6, match=".arrow", rate=1.0)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen([sys.executable, str(script), http_proxy.url, str(tmp_path / "cache")],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = _lines(child)
        failed = _line(lines, "failed:", within=120.0)  # importing torch and DALI on a loaded machine, then ~1 s
        assert "RemoteStoreError" in failed and "remote_min_rate=1024" in failed and ".arrow" in failed
        _line(lines, "end", within=30.0)
        ended = time.monotonic()
        child.wait(timeout=60)
        took = time.monotonic() - ended
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert took < EXIT_BOUND, f"the program took {took:.1f} s to end after its last line"
