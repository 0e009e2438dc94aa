"""The stage clock: spans, summary, bounded memory, threads, processes and the Chrome trace."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from stallfree.stage_runtime.clock import StageClock, percentile


def test_record_and_summary() -> None:
    clock = StageClock()
    for i in range(10):
        clock.record("read", "busy", float(i), i + 0.1 * (i + 1), batch=i)
    clock.record("input", "waiting", 0.0, 2.0, batch=0)
    stats = clock.summary()
    assert set(stats) == {"read", "input"}
    assert stats["read"].busy_s == pytest.approx(sum(0.1 * (i + 1) for i in range(10)))
    assert stats["read"].busy_count == 10 and stats["read"].waiting_count == 0
    assert stats["read"].p50_s == pytest.approx(0.55)
    assert stats["read"].p90_s == pytest.approx(0.91)
    assert stats["input"].waiting_s == pytest.approx(2.0) and stats["input"].count == 1
    assert [s.batch for s in clock.spans("read")] == list(range(10))


def test_span_context_manager_records_even_on_error() -> None:
    clock = StageClock()
    with clock.span("step", "busy", batch=3):
        time.sleep(0.001)
    with pytest.raises(RuntimeError), clock.span("step"):
        raise RuntimeError("boom")
    spans = clock.spans()
    assert len(spans) == 2 and spans[0].batch == 3 and spans[0].duration > 0


@pytest.mark.parametrize(("state", "start", "end", "match"), [
    ("idle", 0.0, 1.0, "state must be 'busy' or 'waiting', got 'idle'"),
    ("busy", 2.0, 1.0, "ends before it starts"),
])
def test_bad_spans_are_refused(state: str, start: float, end: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StageClock().record("read", state, start, end)


def test_ring_buffer_bounds_memory_and_counts_drops() -> None:
    clock = StageClock(capacity=5)
    for i in range(12):
        clock.record("read", "busy", i, i + 1, batch=i)
    assert len(clock) == 5 and clock.dropped == 7
    assert [s.batch for s in clock.spans()] == [7, 8, 9, 10, 11]
    with pytest.raises(ValueError, match="capacity must be a positive int, got 0"):
        StageClock(capacity=0)


def test_thread_safe() -> None:
    clock = StageClock()
    barrier = threading.Barrier(4)  # all alive at once, so no two share a reused thread id

    def work(k: int) -> None:
        barrier.wait()
        for i in range(2000):
            clock.record(f"t{k}", "busy", i, i + 1, batch=i)
        barrier.wait()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(clock) == 8000 and clock.dropped == 0
    assert {stats.busy_count for stats in clock.summary().values()} == {2000}
    assert len({s.tid for s in clock.spans()}) == 4


def _child(path: str, rank: int) -> None:
    clock = StageClock()
    for i in range(3):
        with clock.span(f"worker{rank}", "busy", batch=i):
            pass
    clock.dump(Path(path) / f"spans-{rank}.json")


def _queue_child(q: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    clock = StageClock()
    clock.record("step", "busy", time.perf_counter(), time.perf_counter() + 1e-3, batch=0)
    q.put(clock.to_records())


def test_processes_merge_through_files_and_queues(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")  # spawn would re-import torch and DALI: 20 s
    before = time.perf_counter()
    procs = [ctx.Process(target=_child, args=(str(tmp_path), r)) for r in range(2)]
    for p in procs:
        p.start()
    q = ctx.Queue()
    qp = ctx.Process(target=_queue_child, args=(q,))
    qp.start()
    records = q.get(timeout=60)
    for p in [*procs, qp]:
        p.join(timeout=60)
        assert p.exitcode == 0
    parent = StageClock()
    with parent.span("parent"):
        pass
    for path in sorted(tmp_path.glob("spans-*.json")):
        assert parent.merge(path) == 3
    assert parent.merge(records) == 1
    spans = parent.spans()
    assert len({s.pid for s in spans}) == 4
    # perf_counter is one monotonic clock for the whole machine: child spans fall after `before`.
    assert all(s.start >= before for s in spans)
    assert set(parent.summary()) == {"parent", "worker0", "worker1", "step"}


def test_merge_refuses_foreign_json(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="not a stallfree span record"):
        StageClock().merge(path)


def test_chrome_trace_is_valid(tmp_path: Path) -> None:
    clock = StageClock()
    clock.record("read", "busy", 10.0, 10.5, batch=0)
    clock.record("input", "waiting", 10.2, 10.6, batch=0)
    trace = json.loads(clock.to_chrome_trace(tmp_path / "trace.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in events] == ["read", "input (waiting)"]
    for e in events:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "cat"} <= set(e)
        assert isinstance(e["ts"], float | int) and e["dur"] >= 0
    assert events[0]["ts"] == 0 and events[0]["dur"] == pytest.approx(5e5)
    assert events[1]["ts"] == pytest.approx(2e5) and events[1]["args"] == {"state": "waiting", "batch": 0}
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"read / input"}


def test_percentile() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    with pytest.raises(ValueError, match="got 101"):
        percentile([1.0], 101)
