"""Ingest's worker processes: the pool that converts chunks of samples, and how each worker ends with its parent."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future, ProcessPoolExecutor

from stallfree.ingest.sources import Plan
from stallfree.ingest.writer import Converted, IngestOptions, convert_items

__all__ = ["converted"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_log = logging.getLogger(__name__)


def converted(plan: Plan, options: IngestOptions, chunks: list[tuple[int, int, int]],
              workers: int) -> Generator[tuple[int, Converted], None, None]:
    """``(shard, piece)`` for every chunk, in order: converted here, or by ``workers`` processes.

    At most 4 chunks per worker are in flight, so that pieces waiting for their shard's write stay few.
    """
    if workers == 1 or len(chunks) <= 1:
        for i, start, end in chunks:
            yield i, convert_items(plan.items[start:end], options, plan.extra_columns)
        return
    import multiprocessing

    # fork where there is one: a spawned child re-imports stallfree, torch and DALI first (seconds each).
    # The children touch only PIL, pyarrow (fork-safe thread pools) and files, never the parent's threads.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    import pyarrow as pa

    pa.array([0])  # its first call imports pandas (most of a second): once here, not in every child
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_die_with_parent,
                             initargs=(os.getpid(),)) as pool:
        pending: deque[tuple[int, Future[Converted]]] = deque()
        for i, start, end in chunks:
            pending.append((i, pool.submit(convert_items, plan.items[start:end], options, plan.extra_columns)))
            if len(pending) >= 4 * workers:
                shard, future = pending.popleft()
                yield shard, future.result()
        while pending:
            shard, future = pending.popleft()
            yield shard, future.result()


def _die_with_parent(parent: int) -> None:
    """A worker's initializer: end this worker when the ingest process dies, even by ``kill -9``.

    An idle worker waits on the task queue, whose write end its sibling workers hold too, so a dead parent closes
    nothing a worker would notice: it would wait forever, holding its memory. Linux's parent-death signal ends it
    at once (the pool forks its workers from the thread that runs :func:`ingest`, and that thread outlives them);
    a thread polling the parent's pid is the fallback elsewhere, and where ``prctl`` fails.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            _log.debug("prctl(PR_SET_PDEATHSIG) failed (errno %d); polling the parent", ctypes.get_errno())
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="stallfree-watch-parent", daemon=True).start()


def _watch_parent(parent: int, interval: float = 0.5) -> None:
    """Exit this process as soon as its parent is no longer ``parent`` (an orphan is adopted by another pid)."""
    while os.getppid() == parent:
        time.sleep(interval)
    os._exit(1)
