"""A real Ray cluster on 127.0.0.1 for the tests marked ``ray``: a head and a second node from ``ray start``.

Ray 2.60 advertises the machine's interface address, not loopback, so these tests run in a network namespace of
their own with only loopback up, where every address Ray uses is 127.0.0.1: the README's second test command
(``unshare --net --map-root-user sh -c 'ip link set lo up && pytest -q -m ray'``). Elsewhere they are skipped
(tests/conftest.py), never pointed at another address. The cluster starts once per test process: the README's
command runs the files in 2 (``-n 2 --dist loadfile``), each with a cluster of its own, as the tests mostly wait.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Ray's token authentication stays on, with a token of this session's own given to every process (the nodes, this
# driver and the workers they start) rather than whatever ~/.ray/auth_token holds; set before Ray is imported, which
# reads its configuration once.
os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"})

ray = pytest.importorskip("ray")  # in the test extra; a clear skip where an old environment lacks it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_cli(*args: str, env: dict[str, str]) -> None:
    command = [os.path.join(os.path.dirname(sys.executable), "ray"), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def _stop_nodes_under(temp: Path) -> None:
    """Stop this cluster's processes alone: those whose command line names its temp dir, or whose environment holds
    this session's token (the head's Ray client server names neither its temp dir nor a parent that stays, and
    outlived the session); ``ray stop`` would stop every Ray process on the machine, other sessions' included."""
    import psutil

    def ours(process: psutil.Process) -> bool:
        if str(temp) in " ".join(process.info["cmdline"] or ()):
            return True
        if process.pid == os.getpid() or "ray" not in " ".join(process.info["cmdline"] or ()):
            return False
        with contextlib.suppress(psutil.Error):
            return bool(process.environ().get("RAY_AUTH_TOKEN") == os.environ["RAY_AUTH_TOKEN"])
        return False

    roots = [p for p in psutil.process_iter(["cmdline"]) if ours(p)]
    mine = {p.pid: p for p in roots}
    for root in roots:  # the agents a raylet starts rename themselves (ray::DashboardAgent): take them as children
        with contextlib.suppress(psutil.NoSuchProcess):
            mine.update({child.pid: child for child in root.children(recursive=True)})
    # Killed, as `ray stop --force` does: on SIGTERM the GCS, the raylets and their agents shut down gracefully, and
    # took 15 s to (the session's last teardown, measured), for a cluster whose state is deleted next.
    for process in mine.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(list(mine.values()), timeout=15)


def connect(address: str) -> None:
    """Make this process a driver of the cluster at ``address`` (leaving any other it is connected to)."""
    if ray.is_initialized():
        if ray.get_runtime_context().gcs_address == address:
            return
        ray.shutdown()
    ray.init(address=address, include_dashboard=False, log_to_driver=False)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The address (``127.0.0.1:PORT``) of a two-node cluster: a head of 1 CPU and a second node of 2."""
    port = _free_port()
    # Short: Ray's socket paths under it must fit in 107 bytes, and pytest's own temporary folders are deeper under
    # pytest-xdist (popen-gwN).
    temp = Path(tempfile.mkdtemp(prefix="sf-ray-"))
    env = dict(os.environ)
    address = f"127.0.0.1:{port}"
    _ray_cli("start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
             "--node-ip-address=127.0.0.1", f"--temp-dir={temp}", "--disable-usage-stats", env=env)
    try:
        _ray_cli("start", f"--address={address}", "--num-cpus=2", "--node-ip-address=127.0.0.1", env=env)
        connect(address)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _stop_nodes_under(temp)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def ray_connected(ray_cluster: str) -> str:
    """The cluster's address, with this process connected to it (a test before may have left for another)."""
    connect(ray_cluster)
    return ray_cluster


@pytest.fixture
def workers_of(ray_connected: str) -> Iterator[Any]:
    """``workers_of(n, **options)``: a RayWorkers whose actors are ended after the test (the cluster has 3 CPUs)."""
    from stallfree import RayWorkers

    made: list[RayWorkers] = []

    def build(n: int, **options: Any) -> RayWorkers:
        workers = RayWorkers(num_workers=n, **options)
        made.append(workers)
        return workers

    yield build
    for workers in made:
        workers.close()
