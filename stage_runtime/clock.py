"""The stage clock: one low-overhead recorder of ``busy``/``waiting`` spans that every stage reports to.

A span is ``(stage, state, start, end, batch)`` with times from :func:`time.perf_counter`, plus the process and
thread that recorded it. The Loader reports ``read``/``augment``/``h2d`` (busy) and ``input`` (waiting); the
profiler and the trainer add ``step`` and their own stages. Memory is bounded: the clock keeps the newest
``capacity`` spans in a ring buffer and counts the ones it dropped.

Across processes: on Linux ``perf_counter`` is ``CLOCK_MONOTONIC``, one clock for the whole machine, so spans
recorded in different processes of one machine line up. Each process records into its own ``StageClock`` and
writes it with :meth:`StageClock.dump` (or sends :meth:`StageClock.to_records` through a queue); the parent
merges them with :meth:`StageClock.merge`::

    child:   clock.dump(run_dir / f"spans-{rank}.json")
    parent:  for path in run_dir.glob("spans-*.json"): clock.merge(path)
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from stallfree.core.atomic import atomic_write

__all__ = ["Span", "StageClock", "StageStats", "percentile"]

State = Literal["busy", "waiting"]
_STATES = ("busy", "waiting")
_FORMAT = "stallfree-spans/1"

# os.getpid() is a system call (glibc stopped caching it); the hot path reads this instead, reset after fork.
_pid = os.getpid()


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


@dataclass(frozen=True)
class Span:
    """One interval a stage spent ``busy`` or ``waiting``; times in seconds from ``time.perf_counter()``."""

    stage: str
    state: str
    start: float
    end: float
    batch: int | None
    pid: int
    tid: int

    @property
    def duration(self) -> float:
        """``end - start`` in seconds."""
        return self.end - self.start


@dataclass(frozen=True)
class StageStats:
    """Summary of one stage's spans: totals per state, span counts and duration percentiles (seconds)."""

    stage: str
    busy_s: float
    waiting_s: float
    busy_count: int
    waiting_count: int
    p50_s: float
    p90_s: float
    max_s: float

    @property
    def count(self) -> int:
        """All spans of this stage."""
        return self.busy_count + self.waiting_count


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` by linear interpolation; 0.0 when empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class StageClock:
    """A thread-safe, bounded recorder of stage spans.

    Args:
        capacity: the most spans kept; older ones are dropped first and counted in :attr:`dropped`. A kept
            span holds about 200 bytes (``stallfree bench clock``), so the default holds at most about 40 MiB.

    Example::

        clock = StageClock()
        loader = Loader(root, 64, shuffle=True, clock=clock)
        for images, labels in loader:
            with clock.span("step", "busy"):
                train_step(images, labels)
        print(clock.summary()["input"].waiting_s)
        clock.to_chrome_trace("trace.json")      # open in https://ui.perfetto.dev
    """

    def __init__(self, capacity: int = 200_000):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        # Plain tuples, not Span objects: the hot path is one tuple build and one deque append under a lock.
        self._spans: deque[tuple[str, str, float, float, int | None, int, int]] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._recorded = 0

    @property
    def dropped(self) -> int:
        """How many spans the ring buffer has dropped because it was full."""
        with self._lock:
            return self._recorded - len(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def record(self, stage: str, state: str, start: float, end: float, batch: int | None = None) -> None:
        """Record one span; ``state`` is ``"busy"`` or ``"waiting"``, times from ``time.perf_counter()``."""
        if state not in _STATES:
            raise ValueError(f"state must be 'busy' or 'waiting', got {state!r} (stage {stage!r})")
        if end < start:
            raise ValueError(f"span ends before it starts (stage {stage!r}, start {start}, end {end})")
        item = (stage, state, start, end, batch, _pid, threading.get_ident())
        with self._lock:
            self._spans.append(item)
            self._recorded += 1

    def span(self, stage: str, state: State = "busy", batch: int | None = None) -> _SpanTimer:
        """A context manager that times the ``with`` block as one span of ``stage`` (recorded even on error)."""
        return _SpanTimer(self, stage, state, batch)

    def clear(self) -> None:
        """Forget every span and the dropped count."""
        with self._lock:
            self._spans.clear()
            self._recorded = 0

    def spans(self, stage: str | None = None) -> list[Span]:
        """The kept spans in recording order, optionally only those of ``stage``."""
        with self._lock:
            items = list(self._spans)
        return [Span(*item) for item in items if stage is None or item[0] == stage]

    def stages(self) -> list[str]:
        """Stage names in order of first appearance."""
        with self._lock:
            return list(dict.fromkeys(item[0] for item in self._spans))

    def summary(self) -> dict[str, StageStats]:
        """Per stage: busy and waiting totals, span counts, and p50/p90/max span duration."""
        by_stage: dict[str, list[Span]] = {}
        for span in self.spans():
            by_stage.setdefault(span.stage, []).append(span)
        out = {}
        for stage, spans in by_stage.items():
            durations = [s.duration for s in spans]
            busy = [s.duration for s in spans if s.state == "busy"]
            waiting = [s.duration for s in spans if s.state == "waiting"]
            out[stage] = StageStats(stage, sum(busy), sum(waiting), len(busy), len(waiting),
                                    percentile(durations, 50), percentile(durations, 90), max(durations))
        return out

    # ---- across processes -------------------------------------------------------------------------------

    def to_records(self) -> dict[str, Any]:
        """The spans as a JSON-able dict (for a file or a ``multiprocessing`` queue); see :meth:`merge`."""
        with self._lock:
            items = [list(item) for item in self._spans]
            dropped = self._recorded - len(self._spans)
        return {"format": _FORMAT, "pid": _pid, "dropped": dropped, "spans": items}

    def dump(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_records` to ``path`` as JSON (atomically: a reader never sees half a file)."""
        path = Path(path)
        atomic_write(path, json.dumps(self.to_records()).encode())
        return path

    def merge(self, source: StageClock | dict[str, Any] | str | os.PathLike[str]) -> int:
        """Add the spans of another clock, of a :meth:`to_records` dict, or of a :meth:`dump` file.

        Returns:
            the number of spans added. Their dropped count is added to this clock's.
        """
        if isinstance(source, StageClock):
            records = source.to_records()
        elif isinstance(source, dict):
            records = source
        else:
            records = json.loads(Path(source).read_text())
        if records.get("format") != _FORMAT:
            raise ValueError(f"not a stallfree span record (format {records.get('format')!r}, "
                             f"expected {_FORMAT!r}); write it with StageClock.dump")
        items = [(str(s), str(st), float(a), float(b), None if n is None else int(n), int(p), int(t))
                 for s, st, a, b, n, p, t in records["spans"]]
        with self._lock:
            self._spans.extend(items)
            self._recorded += len(items) + int(records.get("dropped", 0))
        return len(items)

    # ---- Chrome trace -----------------------------------------------------------------------------------

    def chrome_trace(self) -> dict[str, Any]:
        """The spans as a Chrome trace dict: complete (``"X"``) events, microseconds from the first span."""
        spans = self.spans()
        origin = min((s.start for s in spans), default=0.0)
        # Perfetto shows one row per (pid, tid); name each row after the stages recorded on it.
        tids: dict[tuple[int, int], int] = {}
        row_stages: dict[tuple[int, int], list[str]] = {}
        events: list[dict[str, Any]] = []
        for span in spans:
            key = (span.pid, span.tid)
            tid = tids.setdefault(key, len(tids) + 1)
            names = row_stages.setdefault(key, [])
            if span.stage not in names:
                names.append(span.stage)
            args: dict[str, Any] = {"state": span.state}
            if span.batch is not None:
                args["batch"] = span.batch
            events.append({"name": span.stage if span.state == "busy" else f"{span.stage} (waiting)",
                           "cat": span.state, "ph": "X", "pid": span.pid, "tid": tid,
                           "ts": round((span.start - origin) * 1e6, 3),
                           "dur": round(span.duration * 1e6, 3), "args": args})
        meta = [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tids[(pid, t)],
                 "args": {"name": " / ".join(names)}} for (pid, t), names in row_stages.items()]
        meta += [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"stallfree {pid}"}}
                 for pid in dict.fromkeys(pid for pid, _ in tids)]
        return {"traceEvents": meta + events, "displayTimeUnit": "ms",
                "otherData": {"dropped_spans": self.dropped, "clock": "time.perf_counter"}}

    def to_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`chrome_trace` to ``path`` (``trace.json``; open it in https://ui.perfetto.dev)."""
        path = Path(path)
        path.write_text(json.dumps(self.chrome_trace()))
        return path



class _SpanTimer:
    """``StageClock.span``'s context manager: a class, because a generator-based one costs several times more."""

    __slots__ = ("batch", "clock", "stage", "start", "state")

    def __init__(self, clock: StageClock, stage: str, state: str, batch: int | None):
        self.clock, self.stage, self.state, self.batch = clock, stage, state, batch
        self.start = 0.0

    def __enter__(self) -> _SpanTimer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.clock.record(self.stage, self.state, self.start, time.perf_counter(), self.batch)
