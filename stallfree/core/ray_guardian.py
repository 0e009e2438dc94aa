"""The guardian of a local Ray cluster stallfree started: it ends the cluster's processes when their driver dies.

``ray.init()`` with no cluster to join starts one inside the calling process: its GCS and raylet are the driver's
children and die with it (Ray sets ``PR_SET_PDEATHSIG`` on them), but the agents the raylet starts
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``: about 220 MB) outlive a driver killed with SIGKILL, for good.
So when :func:`~stallfree.core.ray_cluster.connect` starts a cluster it also starts this guardian, a small process of
its own session (a Ctrl-C or a ``kill`` of the driver's process group does not reach it)::

    driver ─┬─ gcs_server, raylet, ... (Ray's own; die with the driver)
            │     └─ raylet's agents and workers (outlive it)
            └─ guardian: every 0.5 s notes the cluster's processes (the driver's Ray children and all below them);
                 once its parent is gone (it is reparented), ends those still running: SIGTERM, then SIGKILL after 5 s

It ends only processes it noted while the driver lived (each known by pid and start time, so a reused pid is never
hit), and leaves once the cluster's processes are gone (``ray.shutdown()``) while the driver goes on. It runs as
``python -I .../ray_guardian.py DRIVER_PID ROOT_PID...``: this file alone, with psutil, isolated from the driver's
paths.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

__all__ = ["guard", "ray_children"]

_SCAN_S = 0.5  # how often the guardian notes the cluster's processes (the raylet starts its agents within a second)
_GRACE_S = 5.0  # SIGTERM, then SIGKILL for those still running after this


def ray_children() -> set[int]:
    """The pids of this process's children that are Ray's (their command line names ray)."""
    import psutil

    found = set()
    for child in psutil.Process().children():
        try:
            if "ray" in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.Error:  # gone, or not ours to read: not a process this process started for Ray
            continue
    return found


_guardians: list[subprocess.Popen[bytes]] = []  # kept: a Popen dropped while its process runs warns


def guard(roots: set[int]) -> None:
    """Start the guardian of the cluster whose processes ``roots`` (children of this process) are, if any."""
    if not roots:
        return
    _guardians[:] = [g for g in _guardians if g.poll() is None]
    _guardians.append(subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), *map(str, sorted(roots))],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
        start_new_session=True,  # the driver's Ctrl-C or process-group kill must not end it before it cleans up
    ))


def _watch(driver: int, roots: Sequence[int]) -> None:
    """Note the cluster's processes until ``driver`` dies (then end them) or they are all gone (then leave)."""
    import psutil

    noted: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            noted[pid] = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
    while True:
        for process in list(noted.values()):
            try:
                noted.update((child.pid, child) for child in process.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        if os.getppid() != driver:  # reparented: the driver died, however it died
            break
        if not any(_running(process) for process in noted.values()):
            return  # the cluster was shut down while the driver goes on
        time.sleep(_SCAN_S)
    running = [process for process in noted.values() if _running(process)]
    for process in running:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            continue
    _, left = psutil.wait_procs(running, timeout=_GRACE_S)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue


def _running(process: psutil.Process) -> bool:
    """Whether ``process`` (the one noted, not a later one of its pid) runs: a zombie has ended."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    _watch(int(sys.argv[1]), [int(pid) for pid in sys.argv[2:]])
