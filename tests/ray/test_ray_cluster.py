"""Connecting to a Ray cluster (stallfree/core/ray_cluster.py): a refused auth token is named, and a local cluster
stallfree started ends with it, even when it is killed with SIGKILL (issue 44, item 10).

Every case runs ``stallfree ingest SRC OUT --ray`` as a user would, in a process of its own: Ray reads its token
settings once per process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

pytestmark = pytest.mark.ray


def images(root: Path, count: int) -> Path:
    """``count`` 24x24 PNGs in one class folder."""
    rng = np.random.default_rng(44)
    (root / "a").mkdir(parents=True)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(root / "a" / f"{i:03d}.png")
    return root


def ingest(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stallfree", "ingest", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize(("token", "said"), [
    # a token that is not the cluster's: Ray said only "Failed to connect to Ray cluster at ..." after 20 s
    ({"RAY_AUTH_TOKEN": "0" * 64}, "the cluster refused this process's auth token: this process sends the token in "
                                   "RAY_AUTH_TOKEN"),
    # no token mode here (none set, no ~/.ray/auth_token): the same bare "Failed to connect"
    ({"RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": None},
     "the cluster refused this process's auth token: this process sends no token (RAY_AUTH_MODE is not 'token' here)"),
    # token mode and no token anywhere: Ray's AuthenticationError ended the command in a traceback
    ({"RAY_AUTH_TOKEN": None}, "Token authentication is enabled but no authentication token was found"),
])
def test_a_wrong_or_missing_auth_token_is_named(ray_cluster: str, tmp_path: Path, token: dict[str, str | None],
                                                said: str) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}  # no ~/.ray/auth_token to fall back on
    for key, value in token.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env["RAY_gcs_server_port_wait_time_s"] = "2"  # Ray's tries to connect, 20 s of them by default
    child = ingest([str(images(tmp_path / "src", 2)), str(tmp_path / "out"), "--ray", ray_cluster], env)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 1, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"stallfree ingest: error: cannot connect to the Ray cluster at {ray_cluster}: "), stderr
    assert said in line
    if "refused" in said:
        assert "`ray get-auth-token` on its head node prints it" in line


def test_kill_9_of_ingest_on_a_local_cluster_it_started_leaves_no_ray_process(tmp_path: Path) -> None:
    """Before, the raylet's agents (ray::DashboardAgent, ray::RuntimeEnvAgent: about 220 MB) ran on for good."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}  # a local cluster, started here
    out = tmp_path / "out"
    driver = ingest([str(images(tmp_path / "src", 300)), str(out), "--ray", "--parts", "1", "--shard-size", "0.001"],
                    env)
    started: list[psutil.Process] = []
    try:
        wait_for(lambda: any(out.glob("*.arrow")) or driver.poll() is not None, "the task's first shard")
        assert driver.poll() is None, driver.communicate()  # still ingesting: its cluster is up and working
        started = psutil.Process(driver.pid).children(recursive=True)
        names = {process.name() for process in started}
        assert {"gcs_server", "raylet"} <= names and any(name.startswith("ray::") for name in names), names
        driver.send_signal(signal.SIGKILL)
        driver.communicate()

        def running() -> list[str]:
            left = []
            for process in started:
                with contextlib.suppress(psutil.NoSuchProcess):
                    if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                        left.append(f"{process.pid} {process.name()}")
            return left

        with contextlib.suppress(AssertionError):
            wait_for(lambda: not running(), "the Ray processes the killed command started to end", timeout=60)
        assert not running(), "still running a minute after the command was killed"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
        for process in started:  # what a failure above left running
            with contextlib.suppress(psutil.Error):
                process.kill()
