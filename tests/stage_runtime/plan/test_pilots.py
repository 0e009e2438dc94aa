"""The host overhead fitted from pilot jobs: what made the pilots' spans and steps is found again from them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.plan.books import predicted_books
from stallfree.stage_runtime.plan.costs import HostOverhead, Link, stage_costs
from stallfree.stage_runtime.plan.orders import placement, torch_order
from stallfree.stage_runtime.plan.pilots import (
    Pilot,
    _non_negative_fit,
    fit_pilots,
    mean_step,
    measured_step,
    read_pilot,
)
from stallfree.stage_runtime.plan.simulate import simulate

LINK = Link(2e9, 0.0)
LAYERS = [LayerTimes(300e-6, 600e-6, 300e-6, 1000, 4096), LayerTimes(200e-6, 500e-6, 250e-6, 1000, 4096),
          LayerTimes(250e-6, 550e-6, 260e-6, 1000, 4096), LayerTimes(150e-6, 400e-6, 200e-6, 1000, 160)]
TRUTH = HostOverhead(100e-6, 200e-6, 0.0, send_s=60e-6, gap_s=80e-6,
                     kind_s=(("B", 150e-6), ("F", 90e-6), ("I", 120e-6), ("W", 140e-6)))


def _per_rank(schedule: str) -> int:
    return 1 if schedule in ("gpipe", "1f1b") else 2


def _simulated(schedule: str, m: int, overhead: HostOverhead) -> float:
    """The simulated step as the trainer times it: the pipeline's whole step (the books' step)."""
    per_rank = _per_rank(schedule)
    owner = placement(schedule, 2, 2 * per_rank)
    costs = stage_costs(LAYERS, [len(LAYERS) // len(owner)] * len(owner))
    program = torch_order(schedule, 2, m, per_rank)
    result = simulate(program, owner, costs, lambda a, b: LINK, overhead=overhead)
    return predicted_books(result, program, owner, costs, 1).step_s


def _pilot(schedule: str, m: int, spans_from: HostOverhead, step_s: float | None = None,
           model: str = "mlp") -> Pilot:
    """A pilot as if the simulator were the machine: its spans made with ``spans_from``."""
    per_rank = _per_rank(schedule)
    owner = placement(schedule, 2, 2 * per_rank)
    costs = stage_costs(LAYERS, [len(LAYERS) // len(owner)] * len(owner))
    program = torch_order(schedule, 2, m, per_rank)
    result = simulate(program, owner, costs, lambda a, b: LINK, overhead=spans_from)
    trainer_step = predicted_books(result, program, owner, costs, 1).step_s
    return Pilot(f"/pilots/{schedule}-m{m}", model, schedule, 2, m, program, tuple(owner), tuple(costs),
                 trainer_step if step_s is None else step_s, (tuple(result.spans),))


def test_two_costs_are_told_apart_by_few_and_many_microbatches() -> None:
    assert _non_negative_fit([(4.0, 1.0 + 4.0 * 0.5), (16.0, 1.0 + 16.0 * 0.5)]) == pytest.approx((1.0, 0.5))
    # a fit that wants a negative cost keeps it at 0 and fits the other alone
    assert _non_negative_fit([(4.0, 2.0), (16.0, 1.0)]) == pytest.approx((1.5, 0.0))
    assert _non_negative_fit([(4.0, 0.0), (16.0, 4.0)]) == pytest.approx((0.0, (16 * 4.0) / (16 + 256)))
    # one configuration: all of it is the step's set-up
    assert _non_negative_fit([(8.0, 3e-3)]) == pytest.approx((3e-3, 0.0))


def test_the_fitted_overhead_is_the_one_that_made_the_pilots() -> None:
    truth = replace(TRUTH, step_s=2e-3)  # a set-up per step: in the measured step, not in the spans
    pilots = [_pilot("gpipe", 2, truth), _pilot("gpipe", 8, truth), _pilot("zero-bubble", 2, truth),
              _pilot("zero-bubble", 8, truth)]
    fit = fit_pilots(pilots, LINK)
    gpipe = fit.overhead("gpipe")
    assert gpipe is not None and gpipe.step_s == pytest.approx(2e-3, abs=1e-9)
    assert gpipe.gap_s == pytest.approx(80e-6, abs=1e-9) and gpipe.message_s == pytest.approx(200e-6, abs=1e-9)
    # so a configuration no pilot ran is predicted as the machine would run it
    assert _simulated("gpipe", 4, gpipe) == pytest.approx(_simulated("gpipe", 4, truth), rel=1e-9)
    zb = fit.overhead("zero-bubble")
    assert zb is not None and dict(zb.kind_s) == pytest.approx({"F": 90e-6, "I": 120e-6, "W": 140e-6}, abs=1e-9)
    # the step, as the trainer times it, ends with the other rank's last weight gradients, as the books' step does:
    # none of them is taken for a set-up per step
    assert zb.step_s == pytest.approx(2e-3, abs=1e-9) and zb.gap_s == pytest.approx(80e-6, abs=1e-9)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_schedules_delay_of_its_messages_beyond_the_link_is_fitted(schedule: str) -> None:
    truth = replace(TRUTH, wire_s=300e-6)  # each message 0.3 ms later than the link says
    fitted = fit_pilots([_pilot(schedule, m, truth) for m in (2, 8)], LINK).overhead(schedule)
    assert fitted is not None and fitted.wire_s == pytest.approx(300e-6, abs=1e-9)
    assert fitted.step_s == pytest.approx(0.0, abs=1e-9) and fitted.gap_s == pytest.approx(80e-6, abs=1e-9)
    assert _simulated(schedule, 4, fitted) == pytest.approx(_simulated(schedule, 4, truth), rel=1e-9)


@pytest.mark.parametrize(("schedule", "hidden"), [("gpipe", 100e-6), ("gpipe", 1e-3), ("1f1b", 1e-3)])
def test_an_idle_per_action_the_spans_do_not_show_is_told_from_a_set_up_per_step(schedule: str,
                                                                                 hidden: float) -> None:
    # The measured steps took ``hidden`` more idle after every action, and a set-up; 1 ms is past where the step
    # grows linearly with the gap (read at 0.1 ms, the fit overshot it)
    setup = 1e-3
    pilots = [_pilot(schedule, m, TRUTH, _simulated(schedule, m, replace(TRUTH, gap_s=TRUTH.gap_s + hidden)) + setup)
              for m in (2, 8)]
    fitted = fit_pilots(pilots, LINK).overhead(schedule)
    assert fitted is not None
    assert fitted.step_s == pytest.approx(setup, rel=1e-3) and fitted.gap_s == pytest.approx(80e-6 + hidden, rel=1e-3)


def test_a_schedule_without_pilots_takes_its_familys_and_runs_count_as_one_configuration() -> None:
    slow = replace(TRUTH, step_s=4e-3)
    pilots = [_pilot("gpipe", 2, TRUTH), _pilot("gpipe", 8, TRUTH),
              _pilot("gpipe", 8, slow, _simulated("gpipe", 8, slow)),  # a second run of a configuration
              _pilot("gpipe", 8, TRUTH)]
    fit = fit_pilots(pilots, LINK)
    assert fit.source("gpipe") == "schedule" and fit.source("1f1b") == "family" and fit.source("zbv") == "none"
    assert fit.overhead("1f1b") == fit.families["loop"] and fit.overhead("zbv") is None
    own = fit.overhead("gpipe")
    assert own is not None and own.step_s == pytest.approx(0.0, abs=1e-9)  # the median of M=8's three runs
    assert set(fit.to_dict()) == {"schedules", "families"}


def test_pilots_of_two_models_or_none_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one pilot"):
        fit_pilots([], LINK)
    with pytest.raises(ValueError, match="one model and rank count"):
        fit_pilots([_pilot("gpipe", 2, TRUTH), _pilot("gpipe", 8, TRUTH, model="small_cnn")], LINK)


def test_a_pilot_folder_missing_what_the_trainer_writes_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"summary\.json: no such file"):
        read_pilot(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"layer_costs": None, "config": {}}))
    with pytest.raises(ValueError, match="no layer costs.*--balance"):
        read_pilot(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"layer_costs": {"layers": []}, "config": {"shards": 3}}))
    with pytest.raises(ValueError, match="summary.json: its 'config' is not a stallfree train job's"):
        read_pilot(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"train\.jsonl: no such file"):
        measured_step(tmp_path)
    (tmp_path / "train.jsonl").write_text(json.dumps({"event": "start"}) + "\n")
    with pytest.raises(ValueError, match="no training step"):
        measured_step(tmp_path)
    rows = [{"loss": 1.0, "compute_step_s": s, "bubble": b} for s, b in ((9.0, 0.9), (1.0, 0.1), (3.0, 0.3),
                                                                          (2.0, 0.2))]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert measured_step(tmp_path) == (2.0, 0.2)  # the median after the first step
    assert mean_step(tmp_path) == 2.0  # (1 + 3 + 2) / 3: every step after the first
    rows.append({"loss": 1.0, "compute_step_s": 10.0, "bubble": 0.5})  # a step that met a busy machine
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert measured_step(tmp_path)[0] == 2.5 and mean_step(tmp_path) == 4.0
