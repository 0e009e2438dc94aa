"""The Loader's threads run below the training loop, so that the loop's own Python gets a core when it wants one.

What it guards against (issue 49): on 2 cores the Loader's reader, graph stage and DALI's workers shared a core
fairly with the training loop, whose Python ran slower beside the Loader than alone. The slowdown itself is measured
by ``stallfree bench stall``'s loop, never asserted here; what is asserted is each thread's priority.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from stallfree import Loader
from stallfree.pipeline.priority import STEPS, lowered, on_lowered_thread, run_at
from stallfree.transforms import RandomResizedCrop

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")


def _tasks() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _nice(tid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except ProcessLookupError:  # ended since the listing
        return None


@pytest.mark.usefixtures("graph_in_this_process")
def test_every_thread_a_pass_starts_runs_below_the_loop_dalis_workers_too(image_folder: Path) -> None:
    mine = _nice(threading.get_native_id())
    assert mine is not None
    before = _tasks()
    loader = Loader(image_folder, batch_size=4, transform=[RandomResizedCrop(16)], num_threads=2, shuffle=True)
    try:
        passing = iter(loader)
        next(passing)  # the graph is built, its reader and graph stage run
        for _ in passing:  # the whole epoch: the next epoch's run is started ahead too
            pass
        started = {tid: _nice(tid) for tid in _tasks() - before}
        started = {tid: nice for tid, nice in started.items() if nice is not None}
        assert len(started) >= 4, started  # the run's two threads, its reads, and DALI's workers at least
        assert all(nice == min(19, mine + STEPS) for nice in started.values()), (mine, started)
        assert _nice(threading.get_native_id()) == mine  # the loop's own thread keeps its priority
    finally:
        loader.close()


def test_a_build_on_a_lowered_thread_returns_its_value_and_raises_its_error() -> None:
    seen: list[int] = []

    def build() -> str:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return "built"

    expected = lowered()
    assert on_lowered_thread(build) == "built" and seen == [expected]

    def broken() -> None:
        raise ValueError("the graph cannot be built: bad spec")

    with pytest.raises(ValueError, match="the graph cannot be built: bad spec"):
        on_lowered_thread(broken)


def test_a_thread_that_ended_is_passed_over() -> None:
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    assert thread.native_id is not None
    run_at(lowered(), thread.native_id)  # no ProcessLookupError for a thread that is gone


def test_the_graph_process_runs_below_the_loop_all_but_its_waiting_main_thread(image_folder: Path) -> None:
    mine = _nice(threading.get_native_id())
    assert mine is not None
    loader = Loader(image_folder, batch_size=4, transform=[RandomResizedCrop(16)], num_threads=2, shuffle=True)
    try:
        for _ in loader:  # the whole epoch: the next epoch's run is started ahead too
            pass
        pid = loader._epochs.placement._worker.pid
        deadline = time.monotonic() + 5.0
        while True:
            tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
            assert len(tids) >= 5, tids  # its main thread, its runs' stages and pumps, their reads, DALI's workers
            threads = {tid: _nice(tid) for tid in tids if tid != pid}  # the main thread only waits for messages
            if all(nice == min(19, mine + STEPS) for nice in threads.values() if nice is not None):
                break
            # A thread the main thread has just started is lowered by its starter right after its start: on a
            # loaded machine the listing can fall between the two (CI saw it), never for long.
            assert time.monotonic() < deadline, (mine, threads)
            time.sleep(0.05)
    finally:
        loader.close()
