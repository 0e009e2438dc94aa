"""``bench stall``'s loop: what a training loop's own Python loses beside each feed, and the step's wait.

A real training step holds the interpreter's lock (the GIL) for part of its time: launching kernels, the optimizer,
logging. Here each step takes a batch, runs a fixed amount of pure Python work (:class:`PythonWork`: a share ``s``
of the step, ``--shares``, default 0%, 30% and 60%) and then lets the simulated device sleep for the rest of the
step, ``(1 - s) * batch / R`` (no core, no GIL). For each feed (stallfree's Loader as ``bench stall`` builds it, the
same Loader with its graph kept in the loop's process as before issue 49 (``stallfree-here``), torch's DataLoader with
workers, plain DALI: ``bench loader``'s contenders) and each share:

1. the feed warms up over one epoch's batches, then is timed alone over another (no work, no sleep);
2. with ``s > 0``, timed again with the loop's work (sized at 80% of that rate) and no sleep: the rate it sustains
   beside this loop, whose ``--load`` share sets ``R``;
3. trained on at ``R`` for one epoch's batches untimed (the epochs before ran at full speed, and the first batch after
   such an epoch is made only once asked for, which a training loop pays only at its start: ``bench stall``'s first
   part measures that), then for ``--loop-epochs`` epochs' batches, every ``next()`` and every run of the work timed;
4. the feed shut down, the same work is timed again with no feed running: the loop's own time, measured in this run.

Reported: the stall (time in ``next()`` over wall time), the share of ``R`` delivered, and the loop's **slowdown**:
how much longer the work took, on average, than with no feed running (the GIL and the cores the feed took from the
loop), with the work's CPU time in both (the rest is waiting) and its share of the step as timed alone (the work is
sized with the feed idle; on a loaded machine it comes out larger, and every feed's share of ``R`` lower).
The issue-49 goals (at 80% load, with the loop's Python at 0% and at 30% of the step): stall under 1%, at
least 98% of ``R``, the work slowed by under 5%.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from stallfree.core.accelerator import hold

__all__ = ["FEEDS", "GOAL", "SHARES", "PythonWork", "calibrate", "print_loop", "run_loop", "steps_per_cell", "summary"]

SHARES = (0.0, 0.3, 0.6)
FEEDS = {"stallfree": "stallfree", "stallfree-here": "stallfree, graph in the loop's process",
         "torch": "torch DataLoader", "dali": "plain DALI"}
GOAL = {"stall_share": 0.01, "of_r": 0.98, "slowdown": 0.05}  # issue 49, item 3, at 80% load


def _unit(i: int) -> int:
    """One unit of a training loop's own Python: a call, a small dict, integer arithmetic (all under the GIL)."""
    table = {j: (i * 31 + j) & 0xFFFF for j in range(16)}
    return sum(table.values()) + len(str(i))


@dataclass
class PythonWork:
    """``units`` units of pure Python work; calling it runs them and returns the seconds they took.

    And sets :attr:`cpu_s`, the CPU seconds the call's thread spent on them: the wall seconds beyond those are waits
    (for the GIL, or for a core); CPU seconds beyond the work's alone are the core running slower (caches shared
    with the feed's threads).
    """

    units: int
    cpu_s: float = 0.0

    def __call__(self) -> float:
        start, cpu = time.perf_counter(), time.thread_time()
        for i in range(self.units):
            _unit(i)
        self.cpu_s = time.thread_time() - cpu
        return time.perf_counter() - start


def calibrate(seconds: float) -> PythonWork:
    """The work that takes about ``seconds`` on this machine now (call it with no feed running)."""
    probe = PythonWork(2000)
    per_unit = statistics.median(probe() for _ in range(9)) / probe.units  # a loaded machine's typical, not its best
    return PythonWork(max(1, round(seconds / per_unit)))


def _alone(work: PythonWork) -> tuple[float, float]:
    """The work's mean wall and CPU seconds with no feed running: about one second of calls, at least 10."""
    gc.collect()
    first = work()
    times, cpus = [first], [work.cpu_s]
    for _ in range(max(9, min(200, round(1.0 / max(first, 1e-6))))):
        times.append(work())
        cpus.append(work.cpu_s)
    return statistics.fmean(times), statistics.fmean(cpus)


def _steps(stream: Iterator[Any], batches: int, batch: int, work: PythonWork | None, sleep_s: float,
           bar: Any) -> dict[str, Any]:
    """``batches`` steps: take a batch, run the work, let the device sleep ``sleep_s``; every part timed."""
    waits: list[float] = []
    worked: list[float] = []
    cpus: list[float] = []
    start = time.perf_counter()
    for _ in range(batches):
        asked = time.perf_counter()
        next(stream)
        waits.append(time.perf_counter() - asked)
        if work is not None:
            worked.append(work())
            cpus.append(work.cpu_s)
        if sleep_s > 0:
            hold(sleep_s)
        bar.update()
    wall = time.perf_counter() - start
    return {"wall_s": wall, "img_per_s": batches * batch / wall, "waits_s": waits, "work_s": worked, "cpu_s": cpus}


@contextmanager
def _stream(feed: str, args: argparse.Namespace, make_loader: Callable[[], Any]) -> Iterator[Iterator[Any]]:
    """An endless stream of ``feed``'s batches: the Loader's epochs one after another, or a contender's stream."""
    if not feed.startswith("stallfree"):
        from stallfree.bench.loader import contender_stream

        with contender_stream(feed, argparse.Namespace(**{**vars(args), "device": "cpu"})) as stream:
            yield stream
        return

    def epochs(loader: Any) -> Iterable[Any]:
        while True:
            yield from loader

    with _graph_here(feed == "stallfree-here"):
        made = make_loader()
    with made as loader:
        stream = iter(epochs(loader))
        try:
            yield stream
        finally:
            stream.close()  # type: ignore[attr-defined]


@contextmanager
def _graph_here(here: bool) -> Iterator[None]:
    """Loaders built inside keep their graph in this process when ``here``: as before issue 49, in the same run.

    pipeline/process_graph.py reads ``STALLFREE_GRAPH_PROCESS`` when a Loader is built.
    """
    if not here:
        yield
        return
    before = os.environ.get("STALLFREE_GRAPH_PROCESS")
    os.environ["STALLFREE_GRAPH_PROCESS"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["STALLFREE_GRAPH_PROCESS"]
        else:
            os.environ["STALLFREE_GRAPH_PROCESS"] = before


def _cell(feed: str, share: float, args: argparse.Namespace, per_epoch: int, make_loader: Callable[[], Any],
          bar: Any) -> dict[str, Any]:
    """One feed with the loop's Python at ``share`` of the step (the module docstring's steps 1-4)."""
    batch = args.batch_size
    with _stream(feed, args, make_loader) as stream:
        _steps(stream, per_epoch, batch, None, 0.0, bar)  # warm-up: the kernels, the page cache, the workers
        alone = _steps(stream, per_epoch, batch, None, 0.0, bar)["img_per_s"]
        work = None
        beside = alone
        if share > 0:
            # Sized at R as it would be without the loop; the rate the feed then sustains beside it sets R.
            work = _work_for(share * batch / (args.load * alone))
            beside = _steps(stream, per_epoch, batch, work, 0.0, bar)["img_per_s"]
        speed = args.load * beside
        if work is not None:
            work = _work_for(share * batch / speed)
        sleep_s = (1 - share) * batch / speed
        # One epoch at R first: the epochs above ran at full speed, and the first batch of the epoch after one is made
        # only once asked for (docs/records/bench-stall.md), which no training loop pays after its first epoch.
        _steps(stream, per_epoch, batch, work, sleep_s, bar)
        timed = _steps(stream, per_epoch * args.loop_epochs, batch, work, sleep_s, bar)
    time.sleep(0.5)  # the feed's threads and workers see their stop
    own, own_cpu = (None, None) if work is None else _alone(work)
    waits = timed["waits_s"]
    used = statistics.fmean(timed["work_s"]) if timed["work_s"] else None
    used_cpu = statistics.fmean(timed["cpu_s"]) if timed["cpu_s"] else None
    return {"feed": FEEDS[feed], "share": share, "standalone": alone, "beside_loop": beside, "speed": speed,
            "of_r": timed["img_per_s"] / speed, "stall": sum(waits) / timed["wall_s"],
            "wait_max_ms": max(waits) * 1e3, "work_units": None if work is None else work.units,
            "work_alone_ms": None if own is None else own * 1e3, "work_run_ms": None if used is None else used * 1e3,
            "slowdown": None if own is None or used is None else used / own - 1,
            # The work's share of the step as timed alone: the stated share when the calibration (with the feed idle)
            # met the machine as the timing alone did; on a loaded machine it differs, and so does the share of R.
            "share_alone": None if own is None else own / (batch / speed),
            "work_alone_cpu_ms": None if own_cpu is None else own_cpu * 1e3,
            "work_run_cpu_ms": None if used_cpu is None else used_cpu * 1e3,
            "waits_ms": [round(w * 1e3, 3) for w in waits]}


def _work_for(seconds: float) -> PythonWork:
    """The work of ``seconds``, from the per-unit cost measured while the feed is idle (its queues full)."""
    time.sleep(0.3)  # the stream is not advanced: its queues fill and its threads go to sleep
    return calibrate(seconds)


def run_loop(args: argparse.Namespace, per_epoch: int, make_loader: Callable[[], Any],
             bar: Any) -> list[dict[str, Any]]:
    """Every (feed, share) cell, ``args.runs`` times, shares and feeds in turn so that drift falls on each alike."""
    cells = []
    for _ in range(args.runs):
        for share in args.shares:
            for feed in args.feeds:
                cells.append(_cell(feed, share, args, per_epoch, make_loader, bar))
    return cells


def steps_per_cell(args: argparse.Namespace, per_epoch: int, share: float) -> int:
    """The batches one cell takes (for the progress bar)."""
    return per_epoch * (3 + (share > 0) + args.loop_epochs)


def summary(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the runs of each (feed, share), with whether issue 49's goals are met."""
    keys = ("standalone", "beside_loop", "speed", "of_r", "stall", "wait_max_ms", "work_alone_ms", "work_run_ms",
            "slowdown", "work_alone_cpu_ms", "work_run_cpu_ms", "share_alone")
    out = []
    for feed, share in dict.fromkeys((c["feed"], c["share"]) for c in cells):
        mine = [c for c in cells if c["feed"] == feed and c["share"] == share]
        row: dict[str, Any] = {"feed": feed, "share": share, "runs": len(mine)}
        for key in keys:
            values = [c[key] for c in mine if c[key] is not None]
            row[key] = statistics.median(values) if values else None
        row["met"] = (row["stall"] < GOAL["stall_share"] and row["of_r"] >= GOAL["of_r"]
                      and (row["slowdown"] is None or row["slowdown"] < GOAL["slowdown"]))
        out.append(row)
    return out


def print_loop(rows: list[dict[str, Any]], load: float, out: TextIO) -> None:
    """The loop's table: one row per (feed, share), medians over the runs."""
    print(f"\nthe loop's own Python beside each feed (at {load:.0%} of the rate each feed sustains beside the loop; "
          "medians over the runs)", file=out)
    print("| feed | Python share (timed alone) | alone img/s | beside loop img/s | R img/s | of R | stall | "
          "max wait ms | Python alone ms (CPU) | Python in run ms (CPU) | slowdown | goal |", file=out)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|", file=out)

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for r in rows:
        slow = "-" if r["slowdown"] is None else f"{r['slowdown']:+.1%}"
        alone = "" if r["share_alone"] is None else f" ({r['share_alone']:.0%})"
        print(f"| {r['feed']} | {r['share']:.0%}{alone} | {r['standalone']:.0f} | {r['beside_loop']:.0f} | "
              f"{r['speed']:.0f} | {r['of_r']:.1%} | {r['stall']:.2%} | {r['wait_max_ms']:.1f} | "
              f"{ms(r['work_alone_ms'])} ({ms(r['work_alone_cpu_ms'])}) | "
              f"{ms(r['work_run_ms'])} ({ms(r['work_run_cpu_ms'])}) | {slow} | "
              f"{'met' if r['met'] else 'not met'} |", file=out)
    print(f"goal (issue 49): stall < {GOAL['stall_share']:.0%}, >= {GOAL['of_r']:.0%} of R, the loop's Python slowed "
          f"by < {GOAL['slowdown']:.0%} against the same work with no feed running", file=out)
