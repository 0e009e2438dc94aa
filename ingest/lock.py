"""One ingest at a time in an output folder: an OS file lock, which the kernel releases when the run ends, however.

Two runs writing one ``OUT`` would interleave their shards into a dataset that is neither (and that ``stallfree
verify`` passes, since every shard matches its own record). So a run holds ``fcntl.flock`` locks on files in
``OUT/.ingest/`` for as long as it writes, and a second run is refused at once, with one line naming the first
run's pid, host and source. The kernel drops a process's locks when it dies, ``kill -9`` included, so a lock never
outlives its run and nothing stale is ever broken by hand.

The parts of a split ingest (``--part i/N``) may write one folder at the same time, so there are two locks::

    .ingest/lock                     whole run: exclusive         a part: shared  (a whole run and a part exclude)
    .ingest/lock.json                whole run: exclusive, holds {"pid", "host", "source", "part", "started"}
    .ingest/lock.part-I-of-N.json    part I of N: exclusive, holds the same (the same part twice is refused)

A run takes its ``lock*.json`` first and writes who it is into it, then ``lock``; a refused run finds its
holder among the ``lock*.json`` files still locked. ``flock`` works on local file systems and on NFS (where Linux
maps it to the server's locks), which is where the parts of one job share a folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["FolderLocked", "ingest_lock"]

GATE = "lock"

#: The lock files' descriptors this process holds open. A forked child (an ingest worker) closes its copies at once:
#: a flock belongs to the open file, so a worker that outlived its run would otherwise keep the folder locked.
_held: set[int] = set()


def _close_inherited() -> None:
    for fd in _held:  # closing a copy leaves the parent's lock as it is (LOCK_UN would release it for both)
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()


os.register_at_fork(after_in_child=_close_inherited)


class FolderLocked(ValueError):
    """The output folder is being written by another run (the message names its pid, host and source)."""


def _owner_name(part: tuple[int, int] | None) -> str:
    return "lock.json" if part is None or part[1] == 1 else f"lock.part-{part[0]}-of-{part[1]}.json"


def _try(fd: int, mode: int) -> bool:
    """Take the flock ``mode`` on ``fd`` without waiting; whether it was taken."""
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holders(paths: list[Path]) -> list[dict[str, Any]]:
    """Who holds the ``lock*.json`` files ``paths`` now (those this process can lock are free)."""
    found = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # its folder was removed (a URL's staging folder, at the end of its run)
            continue
        try:
            if _try(fd, fcntl.LOCK_SH):
                continue  # free: a finished or killed run's
            with contextlib.suppress(ValueError):  # being written this instant: shown without details
                holder = json.loads(os.read(fd, 1 << 16) or b"{}")
                found.append(holder if isinstance(holder, dict) else {})
        finally:
            os.close(fd)
    return found


def _who(holder: dict[str, Any]) -> str:
    """A run that holds the folder, as a refused run names it."""
    part = holder.get("part")
    if "pid" not in holder:  # its file is empty: the run is between taking its lock and writing who it is
        return "another stallfree ingest (starting or ending just now)"
    pid, host, started = holder.get("pid"), holder.get("host"), holder.get("started")
    if part == "merge":
        return f"stallfree ingest --merge pid {pid} on {host}, started {started}"
    split = f" --part {part[0]}/{part[1]}" if isinstance(part, list) and len(part) == 2 and part[1] > 1 else ""
    return f"stallfree ingest pid {pid} on {host} of {holder.get('source')}{split}, started {started}"


def _refusal(out: Path, paths: list[Path]) -> FolderLocked:
    """The error that refuses this run, naming the runs that hold the ``lock*.json`` files ``paths``."""
    holders = _holders(paths)
    who = "; ".join(map(_who, holders or [{}]))
    return FolderLocked(f"{out} is being written by {who}; wait for it to end, or pass another OUT folder")


@contextlib.contextmanager
def ingest_lock(out: str | os.PathLike[str], records: str | os.PathLike[str], source: str,
                part: tuple[int, int] | None = (0, 1)) -> Iterator[None]:
    """Hold ``out``'s ingest locks (files in ``records``, its ``.ingest`` folder) for the ``with`` block.

    Args:
        out: the output folder, as messages name it.
        records: where the lock files are (created).
        source: what this run reads, as a refused run shows it.
        part: ``(i, N)`` for a part of a split ingest, ``(0, 1)`` for a whole run, None for a merge (which writes the
            whole run's files, so it excludes every part).

    Raises:
        FolderLocked: another run holds the folder (named).
    """
    records = Path(records)
    records.mkdir(parents=True, exist_ok=True)
    whole = part is None or part[1] == 1
    name = _owner_name(part)
    owner = os.open(records / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _held.add(owner)
    gate, owned = -1, False
    try:
        if not _try(owner, fcntl.LOCK_EX):  # the same part (or whole run) is running
            raise _refusal(Path(out), [records / name])
        owned = True
        me = {"pid": os.getpid(), "host": socket.gethostname(), "source": source,
              "part": list(part) if part is not None else "merge",
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(owner, 0)
        os.pwrite(owner, json.dumps(me).encode(), 0)
        gate = os.open(records / GATE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        _held.add(gate)
        if not _try(gate, fcntl.LOCK_EX if whole else fcntl.LOCK_SH):
            others = [path for path in sorted(records.glob("lock*.json")) if path.name != name]
            raise _refusal(Path(out), others)
        yield
    finally:
        if gate >= 0:
            _held.discard(gate)
            os.close(gate)  # closing the last descriptor of an open file releases its flock
        if owned:  # who this run was: not another's, whose lock refused this one
            with contextlib.suppress(OSError):
                os.ftruncate(owner, 0)
        _held.discard(owner)
        os.close(owner)
