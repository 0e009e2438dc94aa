"""The stage processes of one machine: the port they meet at, the torch threads each gets, torchrun's ranks.

The trainer starts them (:mod:`stallfree.stage_runtime.train.launcher`), the planner's calibration starts its own
(:mod:`stallfree.stage_runtime.plan.calibrate`) and the simulator shares the cores as they do: one rule for all.
This module imports no torch.
"""

from __future__ import annotations

import os
import socket

__all__ = ["free_port", "stage_threads", "torchrun_env"]


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


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when this process was started by ``torchrun``, else ``None``."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))
