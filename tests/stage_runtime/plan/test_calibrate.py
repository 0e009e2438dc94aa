"""The calibration's fit: the runtime overhead that made a pipeline's spans is found again from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.plan.attribution import Measured, attribute, fit_overhead, steps_from_records
from stallfree.stage_runtime.plan.calibration import Calibration, read_calibration
from stallfree.stage_runtime.plan.costs import HostOverhead, Link, stage_costs
from stallfree.stage_runtime.plan.orders import placement, torch_order
from stallfree.stage_runtime.plan.simulate import simulate

LINK = Link(2e9, 60e-6)
LAYER = LayerTimes(20e-6, 40e-6, 20e-6, 0, 16)


def _measured(truth: HostOverhead, schedule: str, ranks: int, m: int) -> Measured:
    """What the machine would record if the simulator were the machine: one step's spans."""
    per_rank = 2 if schedule in ("zero-bubble", "zbv") else 1
    owner = placement(schedule, ranks, ranks * per_rank)
    costs = stage_costs([LAYER] * len(owner), [1] * len(owner))
    result = simulate(torch_order(schedule, ranks, m, per_rank), owner, costs, lambda a, b: LINK, overhead=truth)
    return Measured([list(result.spans)], owner, costs)


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_fitted_overhead_is_the_one_that_made_the_spans(ranks: int) -> None:
    truth = HostOverhead(150e-6, 900e-6, 0.0, send_s=200e-6, gap_s=80e-6,
                         kind_s=(("B", 300e-6), ("F", 150e-6), ("I", 500e-6), ("W", 700e-6)))
    runs = [_measured(truth, "gpipe", ranks, 2), _measured(truth, "gpipe", ranks, 8),
            _measured(truth, "zero-bubble", ranks, 2 * ranks)]
    fitted, latency = fit_overhead(runs, Link(LINK.bytes_per_s, 1.0))  # a ping-pong's latency is not used
    assert fitted.send_s == pytest.approx(200e-6, abs=1e-9) and fitted.gap_s == pytest.approx(80e-6, abs=1e-9)
    assert fitted.message_s == pytest.approx(900e-6, abs=1e-9) and latency == pytest.approx(LINK.latency_s)
    assert dict(fitted.kind_s) == pytest.approx(dict(truth.kind_s), abs=1e-9)


def test_attribution_names_each_kind_and_message_direction() -> None:
    truth = HostOverhead(100e-6, 50e-6, send_s=250e-6)
    run = _measured(truth, "gpipe", 2, 4)
    found = attribute(run.steps, run.owner)
    assert found.per_action_s == pytest.approx({"F": 120e-6, "B": 140e-6})
    assert set(found.per_message_s) == {"act 0->1", "grad 1->0"}
    # Rank 1 waits for each: the message leaves as it is posted (the send's 250 us follow on its sender) and
    # the receive, posted long before, completes as it arrives.
    delay = LINK.latency_s + LINK.busy_s(16)
    assert found.per_message_s["act 0->1"] == pytest.approx(delay)
    assert found.send_s == pytest.approx(250e-6) and found.samples["send"] > 0


def test_the_trainers_spans_become_the_schedules_operations() -> None:
    order = torch_order("gpipe", 2, 2)
    records = {0: ("rank0", {"spans": [["input", "waiting", 0.0, 0.1, 1]] + [
        ["stage0", "busy", t, t + 0.01, step] for step in (1, 2) for t in (step + 0.0, step + 0.1, step + 0.2,
                                                                           step + 0.3)]}),
               1: ("rank1", {"spans": [["stage1", "busy", t, t + 0.01, step] for step in (1, 2)
                                       for t in (step + 0.05, step + 0.15, step + 0.25, step + 0.35)]})}
    steps = steps_from_records(records, order, skip=1)
    assert len(steps) == 1  # step 1 skipped
    assert [str(s.op) for s in steps[0] if s.rank == 0] == ["0F0", "0F1", "0B0", "0B1"]
    assert steps[0][0].start == pytest.approx(0.0)
    records[1][1]["spans"].pop()
    with pytest.raises(ValueError, match=r"rank1, step 2: 3 busy spans, but rank 1's schedule runs 4 actions"):
        steps_from_records(records, order, skip=1)


def test_a_calibration_file_is_read_back_and_bad_ones_are_named(tmp_path: Path) -> None:
    overhead = HostOverhead(1e-4, 9e-4, 2e-4, send_s=2e-4, kind_s=(("W", 8e-4),))
    calibration = Calibration(Link(2e9, 1e-4), {"loop": overhead}, 2, 1e-5)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"calibration": {"2": calibration.to_dict()}}))
    read = read_calibration(bench)[2]
    assert read.overhead("1f1b") == overhead and read.link.describe() == calibration.link.describe()
    with pytest.raises(ValueError, match=r"no calibrated host overhead for schedule 'zbv' \(measured: loop"):
        read.overhead("zbv")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"link": "1GB/s,1ms"}))
    with pytest.raises(ValueError, match=r"--calibration .*bad.json: wants a calibration"):
        read_calibration(bad)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_calibration(tmp_path / "none.json")


class _Process:
    def __init__(self, exitcode: int | None):
        self.exitcode = exitcode


def test_a_stage_process_that_dies_fails_the_calibration_at_once() -> None:
    import queue
    import time

    from stallfree.stage_runtime.plan.calibrate import _results

    results: queue.Queue = queue.Queue()
    results.put((0, "rank 0's figures"))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="stage process 1 exited with code 3"):
        _results(results, [_Process(0), _Process(3)], timeout=300)
    assert time.monotonic() - start < 5  # not the 300 s it waited before

    results.put((1, "b"))
    results.put((0, "a"))
    assert sorted(_results(results, [_Process(None), _Process(0)], timeout=5)) == [(0, "a"), (1, "b")]
    with pytest.raises(RuntimeError, match="no result from 2 stage process"):
        _results(results, [_Process(None), _Process(None)], timeout=0.2)
