"""The stage clock's cost per span: ``record`` and ``span`` alone, under thread contention, and bytes held.

Every stage of the Loader and the trainer reports to one ``StageClock``, so its cost is paid a few times per
batch. This benchmark times ``--spans`` calls of ``record`` (one thread, then ``--threads`` threads at once on the
same clock) and of the ``span`` context manager, and measures the bytes one kept span holds (tracemalloc). It
states the result against a batch: the Loader records 4 spans per batch, so at 1 µs per span a 10 ms batch pays
0.04%.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import tracemalloc
from typing import Any, TextIO

__all__ = ["add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench clock
  stallfree bench clock --spans 200000 --threads 4 --repeats 5 --json-file clock.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--spans", type=int, default=100_000, help="spans per timed pass (default 100000)")
    parser.add_argument("--threads", type=int, default=4, help="threads recording at once in the contended pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per case (the median is shown)")


def _record(clock: Any, n: int) -> None:
    now = time.perf_counter()
    record = clock.record
    for i in range(n):
        record("read", "busy", now, now, i)


def _span(clock: Any, n: int) -> None:
    span = clock.span
    for i in range(n):
        with span("read", "busy", i):
            pass


def _contended(clock: Any, n: int, threads: int) -> None:
    workers = [threading.Thread(target=_record, args=(clock, n // threads)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def _bytes_per_span(n: int) -> float:
    from stallfree.stage_runtime.clock import StageClock

    clock = StageClock(capacity=n)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    _record(clock, n)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename")) / n


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    from stallfree.stage_runtime.clock import StageClock

    if args.spans < 1 or args.threads < 1 or args.repeats < 1:
        raise ValueError(f"--spans, --threads and --repeats must be >= 1, got {args.spans}, {args.threads}, "
                         f"{args.repeats}")
    cases = {
        "record, 1 thread": lambda c: _record(c, args.spans),
        "span(), 1 thread": lambda c: _span(c, args.spans),
        f"record, {args.threads} threads": lambda c: _contended(c, args.spans, args.threads),
        "ring buffer full (drops)": lambda c: _record(c, args.spans),
    }
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            clock = StageClock(capacity=1000 if "full" in name else args.spans + 1)
            if "full" in name:
                _record(clock, 1000)
            start = time.perf_counter()
            fn(clock)
            results[name].append((time.perf_counter() - start) / args.spans * 1e9)
    bytes_per_span = _bytes_per_span(min(args.spans, 100_000))
    medians = {name: statistics.median(v) for name, v in results.items()}
    print(f"StageClock cost per span, median of {args.repeats} passes of {args.spans} spans", file=out)
    print(f"| {'case':<26} | {'ns / span':>9} | {'share of a 10 ms batch at 4 spans':>33} |", file=out)
    print(f"|{'-' * 28}|{'-' * 10}:|{'-' * 34}:|", file=out)
    for name, ns in medians.items():
        print(f"| {name:<26} | {ns:>9.0f} | {4 * ns / 1e7:>32.4%} |", file=out)
    print(f"memory: {bytes_per_span:.0f} bytes per kept span (the default capacity of 200,000 spans: "
          f"{bytes_per_span * 2e5 / 2**20:.0f} MiB at most)", file=out)
    return {"spans": args.spans, "runs_ns": results, "median_ns": medians, "bytes_per_span": bytes_per_span}
