"""The Loader's threads give the cores to the training loop: each runs at a lower scheduling priority.

A training loop spends part of its step in Python (launching kernels, the optimizer, logging), and on a host with few
cores the Loader's threads want the same cores at the same time: the reader's Python, the graph stage's, DALI's
workers. The operating system's scheduler shares a core fairly between threads of equal priority, so the loop's
Python ran slower beside the Loader than alone (``stallfree bench stall``'s loop, docs/e2e.md). On Linux a thread's
nice value is its own (``setpriority`` on its thread id) and the threads it starts inherit it, so every thread of a
run lowers itself when it starts (:func:`run_at`) and the graph is built on such a thread (DALI's workers
are started by the thread that builds it): the loop gets a core whenever it wants one, and the Loader gets every
cycle the loop leaves, as before. The stand-alone rate is unchanged, since nothing of higher priority competes then.

Only lowered, never raised back (raising needs a privilege, ``CAP_SYS_NICE``), and only relative to the thread that
made the Loader's run, so a job that runs its loop at a set priority keeps the Loader :data:`STEPS` below it. No
option: a DataLoader's workers are other processes that the loop does not wait for either. Elsewhere than Linux a
thread has no priority of its own that ``os`` can set (it would lower the whole process), so nothing changes there.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["STEPS", "lowered", "on_lowered_thread", "run_at"]

#: How many nice steps below the thread that starts them the Loader's threads run. Each step is about 1.25x less
#: CPU under contention: 10 steps give the loop about 90% of a core it shares with one of the Loader's threads.
STEPS = 10
_MOST = 19  # the lowest priority Linux has

T = TypeVar("T")


def lowered() -> int | None:
    """The nice value of the threads the calling thread starts for the Loader.

    Its own plus :data:`STEPS` (at most 19); ``None`` where a thread has no priority of its own (not Linux).
    """
    if sys.platform != "linux":
        return None
    return min(_MOST, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + STEPS)


def run_at(nice: int | None, thread_id: int | None = None) -> None:
    """Give the thread ``thread_id`` (default: the calling one) the nice value ``nice`` (:func:`lowered`'s).

    A thread of a run calls it first thing, so that the threads it starts inherit it, and the thread that started it
    calls it again once it runs, so that it holds when ``start()`` returns; the second call changes nothing.
    ``None``: nothing (not Linux).
    """
    if nice is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id() if thread_id is None else thread_id, nice)
    except ProcessLookupError:  # the thread has already ended
        return
    except PermissionError:  # a sandbox that forbids setpriority: the thread keeps its priority (no batch changes)
        return


def on_lowered_thread(make: Callable[[], T]) -> T:
    """``make()`` called on a new thread at :func:`lowered`'s priority, so that the threads it starts inherit it.

    DALI's workers are started by the thread that builds the graph. The result is returned, and the exception
    raised, here.
    """
    nice = lowered()
    out: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            run_at(nice)
            out.append(make())
        except BaseException as err:  # noqa: BLE001 - raised again on the calling thread
            failure.append(err)

    thread = threading.Thread(target=body, name="stallfree-build", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return out[0]
