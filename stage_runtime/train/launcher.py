"""Launching the stage processes: started here on one machine, or joined from ``torchrun`` across machines.

On one machine the launcher starts one process per rank (``torch.multiprocessing.start_processes``), watches them
all, and when one dies ends the others and raises :class:`StageFailure` naming the rank, its pipeline stage(s) and
the cause in one line, so no process is left blocked in a collective. Under ``torchrun`` (the
``TORCHELASTIC_RUN_ID``/``RANK`` variables are set) each process is already a rank and runs directly; there is no
parent to watch them, so each rank finds the root cause itself (:class:`PeerWatch`).

How the root cause is found. A rank whose own code raised writes its cause down (a file the parent reads, and
a key in the job's TCP store). A rank that only lost its connection, or timed out waiting, is not the cause: it
names the peer that wrote its cause, or else the peer whose heartbeat (a counter each rank bumps in the store
twice a second) stopped moving: killed, stopped (SIGSTOP) or hung.

How the ranks start. With multiprocessing's ``forkserver`` method where the system has it (Linux, macOS), else
``spawn``. A spawned rank is a new interpreter that imports torch and the trainer: 4-5 s of CPU on 2 cores, for each
rank of each launch. The fork server imports them once, for the life of this process, and forks each rank from that
(milliseconds); like ``spawn`` it is started with exec, so a rank holds none of this process's threads, locks or
CUDA state. A rank gets this process's environment as it is at the launch (the server's is that of its start).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["PeerWatch", "StageFailure", "launch", "one_line"]


class StageFailure(RuntimeError):
    """A stage process ended the job: ``rank``, ``stages`` (its global stage indices) and ``cause``."""

    def __init__(self, rank: int, stages: Sequence[int], cause: str):
        names = ", ".join(str(s) for s in stages)
        super().__init__(f"pipeline stage {names} (rank {rank}) failed: {cause}")
        self.rank, self.stages, self.cause = rank, tuple(stages), cause

    def __reduce__(self) -> tuple[Any, ...]:
        return StageFailure, (self.rank, self.stages, self.cause)


def one_line(error: BaseException) -> str:
    """``"Type: message"`` on one line (the message's first line: C++ errors append their stack)."""
    if isinstance(error, StageFailure):
        return error.cause
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if "Traceback (most recent call last):" in lines:  # a child's error as torch relays it: its last line says it
        return lines[-1][:400]
    text = lines[0] if lines else "(no message)"
    return f"{type(error).__name__}: {text[:400]}"


# Texts of the errors a rank gets when a peer, not its own code, failed: gloo's and the store's.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe",
              "Connection refused", "Timed out", "timed out", "Socket Timeout", "Connection timed out")


def lost_peer(error: BaseException) -> bool:
    """Whether ``error`` says a peer went away or never answered (rather than a fault of this rank's own)."""
    return isinstance(error, dist.DistError) or any(text in str(error) for text in _PEER_LOST)


class PeerWatch:
    """Each rank's heartbeat and failure record in the job's TCP store, and the diagnosis of a lost peer.

    Create it after ``init_process_group`` (it connects to ``MASTER_ADDR``:``MASTER_PORT`` as a client).
    """

    def __init__(self, rank: int, world_size: int, interval_s: float = 0.5):
        self.rank, self.world_size, self.interval_s = rank, world_size, interval_s
        # Keys are per attempt: a torchrun restart reuses the store.
        self.prefix = (f"stallfree/{os.environ.get('TORCHELASTIC_RUN_ID', 'spawn')}/"
                       f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")
        self._store, beat_store = self._connect(), self._connect()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(beat_store,), daemon=True, name="stallfree-beat")
        self._thread.start()

    @staticmethod
    def _connect() -> dist.TCPStore:
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                             timeout=datetime.timedelta(seconds=10), wait_for_workers=False)

    def _beat(self, store: dist.TCPStore) -> None:
        key = f"{self.prefix}/beat/{self.rank}"
        while not self._stop.wait(self.interval_s):
            try:
                store.add(key, 1)
            except (RuntimeError, dist.DistError):  # the store's host is gone; the diagnosis reports it
                return

    def close(self) -> None:
        """Stop the heartbeat."""
        self._stop.set()

    def fail(self, cause: str) -> None:
        """Record that this rank's own code failed with ``cause`` (for the peers' diagnosis)."""
        with contextlib.suppress(RuntimeError, dist.DistError):
            self._store.set(f"{self.prefix}/failed/{self.rank}", cause)

    def culprit(self) -> tuple[int, str] | None:
        """The peer that ended the job and why: one that recorded its failure, else one whose heartbeat stopped.

        Waits about ``4 x interval_s`` to watch the heartbeats. ``None`` when every peer looks alive.
        """
        peers = [r for r in range(self.world_size) if r != self.rank]
        try:
            before = {r: self._store.add(f"{self.prefix}/beat/{r}", 0) for r in peers}
            time.sleep(4 * self.interval_s)
            for r in peers:
                key = f"{self.prefix}/failed/{r}"
                if self._store.check([key]):
                    return r, self._store.get(key).decode()
            agreed = f"{self.prefix}/culprit"
            if self._store.check([agreed]):  # a rank that diagnosed first: ranks that died of it look dead too
                rank, cause = json.loads(self._store.get(agreed).decode())
                return int(rank), str(cause)
            stuck = [r for r in peers if self._store.add(f"{self.prefix}/beat/{r}", 0) == before[r]]
            if not stuck:
                return None
            found = (stuck[0], f"stopped responding: no heartbeat for {4 * self.interval_s:.0f} s (killed, stopped "
                               "or hung; see that rank's log)")
            self._store.compare_set(agreed, "", json.dumps(found))
            return found
        except (RuntimeError, dist.DistError):
            host = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            return 0, f"unreachable: the job's store at {host} is gone with the process that hosted it"


def failure(rank: int, error: BaseException, stages_of: Callable[[int], Sequence[int]],
            watch: PeerWatch | None) -> StageFailure:
    """The :class:`StageFailure` that ``error`` in ``rank`` means: this rank's own, or the peer that caused it."""
    if isinstance(error, StageFailure):
        return error
    cause = one_line(error)
    if watch is not None and lost_peer(error):
        found = watch.culprit()
        if found is not None and found[0] != rank:
            return StageFailure(found[0], stages_of(found[0]), f"{found[1]} (rank {rank} saw: {cause})")
        return StageFailure(rank, stages_of(rank), cause)
    if watch is not None:
        watch.fail(cause)
    return StageFailure(rank, stages_of(rank), cause)


def _guarded(rank: int, fn: Callable[..., Any], causes: str, environ: dict[str, str], *args: Any) -> None:
    """A started rank: run ``fn`` in the launcher's ``environ``; on failure write its :class:`StageFailure` down.

    The parent reads it from ``causes``.
    """
    os.environ.clear()  # a fork server's environment is the one it started with: the launch's is this one
    os.environ.update(environ)
    try:
        fn(rank, *args)
    except StageFailure as err:
        record = {"rank": err.rank, "stages": list(err.stages), "cause": err.cause, "own": err.rank == rank,
                  "time": time.time()}
        (Path(causes) / f"rank-{rank}.json").write_text(json.dumps(record))
        raise
    except Exception as err:  # raised before fn could name it (joining the process group): the cause is still ours
        record = {"rank": rank, "stages": [], "cause": one_line(err), "own": True, "time": time.time()}
        (Path(causes) / f"rank-{rank}.json").write_text(json.dumps(record))
        raise


def _records(causes: str) -> list[dict[str, Any]]:
    found = []
    for path in Path(causes).glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return found


def _root_cause(err: BaseException, causes: str, stages_of: Callable[[int], Sequence[int]]) -> StageFailure:
    """The failure to report.

    In this order: the earliest rank whose own code failed; the first process to end, when a signal killed it
    (kill -9, the OOM killer: it could write nothing); the peer a rank diagnosed.
    """
    records = sorted(_records(causes), key=lambda r: (not r["own"], r["time"]))
    if records and records[0]["own"]:
        return StageFailure(records[0]["rank"], records[0]["stages"] or stages_of(records[0]["rank"]),
                            records[0]["cause"])
    rank = int(getattr(err, "error_index", 0))
    if isinstance(err, mp.ProcessExitedException) and err.signal_name and err.signal_name != "SIGTERM":
        return StageFailure(rank, stages_of(rank), f"killed by {err.signal_name}")
    if records:
        return StageFailure(records[0]["rank"], records[0]["stages"] or stages_of(records[0]["rank"]),
                            records[0]["cause"])
    if isinstance(err, mp.ProcessExitedException):
        how = f"killed by {err.signal_name}" if err.signal_name else f"exited with code {err.exit_code}"
        return StageFailure(rank, stages_of(rank), how)
    return StageFailure(rank, stages_of(rank), one_line(err))


@contextlib.contextmanager
def _quiet_spawn_log() -> Iterator[None]:
    """Silence the warning torch's join() logs for each process it terminates: the launcher ends them on purpose."""
    log = logging.getLogger("torch.multiprocessing.spawn")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _start_method(fn: Callable[..., Any]) -> str:
    """``forkserver``, with ``fn``'s module imported by the server, where the system has it; else ``spawn``."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload([fn.__module__])  # read when the server starts: the first launch
    return "forkserver"


def launch(fn: Callable[..., Any], world_size: int, args: tuple, stages_of: Callable[[int], Sequence[int]],
           poll_s: float = 0.2) -> None:
    """Run ``fn(rank, *args)`` in ``world_size`` new processes and wait for all of them.

    ``fn`` should turn its exceptions into :class:`StageFailure` (see :func:`failure`). Ctrl-C in the parent
    sends SIGTERM to every child and returns within seconds (``KeyboardInterrupt`` propagates). Each child
    should put its result where the parent can read it (a file); this returns nothing.

    Raises:
        StageFailure: the process whose failure ended the job, with its stage(s) and cause in one line; the
            others are ended.
    """
    with tempfile.TemporaryDirectory(prefix="stallfree-causes-") as causes, _quiet_spawn_log():
        context = mp.start_processes(_guarded, args=(fn, causes, dict(os.environ), *args), nprocs=world_size,
                                     join=False, start_method=_start_method(fn))
        try:
            while True:
                try:
                    # After a failure, a second for the others to write their diagnosis, then SIGTERM, then
                    # SIGKILL a second later (a SIGSTOPped rank only goes with SIGKILL).
                    if context.join(timeout=poll_s, grace_period=1.0):
                        return
                except (mp.ProcessRaisedException, mp.ProcessExitedException) as err:
                    # join() has already sent SIGTERM to the remaining processes; make sure they are gone.
                    _end(context)
                    raise _root_cause(err, causes, stages_of) from None
        except KeyboardInterrupt:
            _end(context)
            raise


def _end(context: Any, grace_s: float = 3.0) -> None:
    """SIGTERM every live child, then SIGKILL what is left after ``grace_s``."""
    for p in context.processes:
        if p.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in context.processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in context.processes:
        if p.is_alive():
            p.kill()
            p.join(1.0)
