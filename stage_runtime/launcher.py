"""Launching the stage processes: spawned here on one machine, or joined from ``torchrun`` across machines.

On one machine the launcher starts one process per rank (``torch.multiprocessing`` with the ``spawn`` method),
watches them all, and when one dies ends the others and raises :class:`StageFailure` naming the rank, its
pipeline stage(s) and the cause, so no process is left blocked in a collective. Under ``torchrun`` (the
``TORCHELASTIC_RUN_ID``/``RANK`` variables are set) each process is already a rank and runs directly.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch.multiprocessing as mp

__all__ = ["StageFailure", "free_port", "launch", "torchrun_env"]


class StageFailure(RuntimeError):
    """A stage process ended the job: ``rank``, ``stages`` (its global stage indices) and ``cause``."""

    def __init__(self, rank: int, stages: Sequence[int], cause: str):
        names = ", ".join(str(s) for s in stages)
        super().__init__(f"pipeline stage {names} (rank {rank}) failed: {cause}")
        self.rank, self.stages, self.cause = rank, tuple(stages), cause


def free_port() -> int:
    """A TCP port free on this machine for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_env() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_rank)`` when this process was started by ``torchrun``, else ``None``."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or "RANK" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0"))


def _last_error(traceback: str) -> str:
    """From a child's traceback, the last "SomeError: ..." line and what follows (messages may span lines)."""
    lines = [line.rstrip() for line in traceback.strip().splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", line)]
    return " ".join(line.strip() for line in lines[starts[-1]:]) if starts else (lines or ["raised"])[-1]


def _cause(error: BaseException) -> str:
    if isinstance(error, mp.ProcessRaisedException):
        return _last_error(str(error))
    if isinstance(error, mp.ProcessExitedException):
        if error.signal_name:
            return f"killed by {error.signal_name}"
        return f"exited with code {error.exit_code}"
    return str(error)


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")


def _root_cause(context: Any, err: BaseException) -> tuple[int, str]:
    """The failure to report: a rank that lost its peer names the peer that died first, when one did."""
    rank, cause = err.error_index, _cause(err)  # type: ignore[attr-defined]
    if not any(text in cause for text in _PEER_LOST):
        return rank, cause
    for i, p in enumerate(context.processes):
        if i == rank:
            continue
        p.join(2.0)
        if not context.error_queues[i].empty():
            return i, _last_error(context.error_queues[i].get())
        if p.exitcode is not None and p.exitcode < 0 and p.exitcode != -signal.SIGTERM:
            return i, f"killed by {signal.Signals(-p.exitcode).name}"
        if p.exitcode not in (None, 0, -signal.SIGTERM):
            return i, f"exited with code {p.exitcode}"
    return rank, cause


def launch(fn: Callable[..., Any], world_size: int, args: tuple, stages_of: Callable[[int], Sequence[int]],
           poll_s: float = 0.2) -> None:
    """Run ``fn(rank, *args)`` in ``world_size`` spawned processes and wait for all of them.

    Ctrl-C in the parent sends SIGTERM to every child and returns within seconds (``KeyboardInterrupt``
    propagates). Each child should put its result where the parent can read it (a file); this returns nothing.

    Raises:
        StageFailure: the first process that failed, with its stage(s) and cause; the others are ended.
    """
    context = mp.start_processes(fn, args=args, nprocs=world_size, join=False, start_method="spawn")
    try:
        while True:
            try:
                if context.join(timeout=poll_s):
                    return
            except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
                rank, cause = _root_cause(context, err)
                # join() has already sent SIGTERM to the remaining processes; make sure they are gone.
                _end(context)
                raise StageFailure(rank, stages_of(rank), cause) from None
    except KeyboardInterrupt:
        _end(context)
        raise


def _end(context: Any, grace_s: float = 3.0) -> None:
    """SIGTERM every live child, then SIGKILL what is left after ``grace_s``."""
    for p in context.processes:
        if p.is_alive():
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in context.processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in context.processes:
        if p.is_alive():
            p.kill()
            p.join(1.0)
