"""The trainer's report times the pipeline's step whole, counts no time twice, and writes each step once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.stage_runtime.train.report import Report


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]


def test_a_step_runs_from_stage_0_holding_its_batch_to_the_last_ranks_end(tmp_path: Path) -> None:
    report = Report(tmp_path, ranks=2, replicas=1, progress=False)
    # read from 10.0 to 10.5, rank 0's schedule from 10.5, the last rank done at 12.5; 3 s of compute on 2 ranks
    report.step(1, 0, loss=1.0, wait_s=0.5, t0=10.0, start=10.5, end=12.5, busy_s=3.0, images=8)
    report.close()
    row, = _rows(tmp_path)
    assert report.step_times == [(0.5, 2.0)]
    assert row["step_s"] == 2.5 and row["compute_step_s"] == 2.0 and row["input_stall"] == 0.2
    assert row["images_per_s"] == pytest.approx(8 / 2.5) and row["bubble"] == pytest.approx(1 - 3.0 / (2 * 2.0))


def test_steps_the_pipeline_overlaps_are_not_counted_twice(tmp_path: Path) -> None:
    report = Report(tmp_path, ranks=2, replicas=1, progress=False)
    report.step(1, 0, loss=1.0, wait_s=0.0, t0=0.0, start=0.0, end=4.0, busy_s=6.0, images=8)
    # the next batch is read from 3.0 to 3.5, while the last rank still runs step 1 until 4.0: no stall shows
    report.step(2, 0, loss=1.0, wait_s=0.5, t0=3.0, start=3.5, end=6.0, busy_s=4.0, images=8)
    # read from 6.0 to 7.0 after the pipeline went idle at 6.0: the whole wait is a stall
    report.step(3, 0, loss=1.0, wait_s=1.0, t0=6.0, start=7.0, end=9.0, busy_s=4.0, images=8)
    assert report.step_times == [(0.0, 4.0), (0.0, 2.0), (1.0, 2.0)]
    assert sum(w + p for w, p in report.step_times) == 9.0  # the wall from the first read to the last end
    report.synced()  # an evaluation: the next step is timed from its own read, not from step 3's end
    report.step(4, 1, loss=1.0, wait_s=0.25, t0=20.0, start=20.25, end=21.0, busy_s=1.0, images=8)
    assert report.step_times[-1] == (0.25, 0.75)
    report.close()
    assert [row["step"] for row in _rows(tmp_path)] == [1, 2, 3, 4]
    # the summary leaves the first step out: steps 2-4 took 2 + 3 + 1 s for 24 images
    assert report.fractions()["images_per_s"] == pytest.approx(24 / 6.0)


def test_with_replicas_the_step_runs_on_to_the_slowest_replicas_end(tmp_path: Path) -> None:
    # Issue 48: replica 0's pipeline ends at 12.0, the slowest replica's at 12.5; the all-reduce waits for it.
    report = Report(tmp_path, ranks=1, replicas=2, progress=False, unit="tokens")
    report.step(1, 0, loss=1.0, wait_s=0.5, t0=10.0, start=10.5, end=12.0, busy_s=1.5, images=64,
                replicas_end=12.5, work=(90.0, 80.0, 4.0))
    # the next batch is read after the all-reduce, from 12.5: no time between the two steps is left out
    report.step(2, 0, loss=1.0, wait_s=0.5, t0=12.5, start=13.0, end=14.0, busy_s=1.0, images=64,
                replicas_end=14.0, work=(70.0, 80.0, 2.0))
    report.close()
    assert report.step_times == [(0.5, 1.5), (0.5, 1.0)]  # replica 0's wait and pipeline, as before
    assert report.step_loads == [(0.5, 90.0, 80.0, 4.0), (0.0, 70.0, 80.0, 2.0)]
    rows = _rows(tmp_path)
    assert rows[0]["step_s"] == 2.5 and rows[0]["dp_wait_s"] == 0.5 and rows[0]["tokens_per_s"] == 128 / 2.5
    assert report.fractions()["tokens_per_s"] == pytest.approx(128 / 1.5) and report.mean_work() == 70.0


def test_a_predicted_cause_that_rounds_to_nothing_prints_as_zero_not_minus_zero() -> None:
    """The summary's "simulated" line printed "communication -0.0%" for a cause of -1e-5 (the simulator's rounding)."""
    from stallfree.stage_runtime.train.report import _pct

    assert _pct(-0.00001) == "0.0%" and _pct(0.1234) == "12.3%" and _pct(-0.012) == "-1.2%"
