"""The stage processes of one machine: the port they meet at, and the torch threads each gets.

The trainer starts them (:mod:`stallfree.stage_runtime.train.launcher`), the planner's calibration starts its own
(:mod:`stallfree.stage_runtime.plan.calibrate`) and the simulator shares the cores as they do: one rule for all.
This module imports no torch.
"""

from __future__ import annotations

import os
import socket

__all__ = ["free_port", "stage_threads"]


def free_port() -> int:
    """A TCP port free on this machine for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stage_threads(processes: int, threads: int | None = None, cores: int | None = None) -> int:
    """The torch threads each of ``processes`` stage processes on one machine gets.

    ``threads`` if given, else the ``cores`` (default: those this process may use) shared out evenly, at least
    one each. The trainer's rule; the plan simulator and its calibration assume the same of the processes they model.
    """
    cores = cores or len(os.sched_getaffinity(0))
    return threads or max(1, cores // max(1, min(processes, cores)))
