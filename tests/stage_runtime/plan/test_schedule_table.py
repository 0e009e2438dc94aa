"""The table of schedules is the one place a schedule is described (DESIGN.md, "one table of schedules").

A schedule added to ``SCHEDULE_SPECS`` alone, under a name no other module has seen, is ordered, placed, planned,
predicted and given a calibration family exactly as the schedule it copies.
"""

from __future__ import annotations

import dataclasses

import pytest

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.plan.calibration import FAMILIES, Calibration
from stallfree.stage_runtime.plan.costs import HostOverhead, Link, parse_link, scale_layers
from stallfree.stage_runtime.plan.orders import job_program, placement, torch_order
from stallfree.stage_runtime.plan.pilots import PilotFit
from stallfree.stage_runtime.plan.planner import Network, rank_plans
from stallfree.stage_runtime.schedules import SCHEDULE_SPECS, ScheduleSpec

FAST = parse_link("25GB/s,5us")
LAYERS = [LayerTimes(1e-3, 2e-3, 1e-3, 4_000_000, 1_000_000)] * 8


def _plans(schedule: str) -> list[tuple]:
    plans = rank_plans(lambda b: scale_layers(LAYERS, b / 8), 1e-3, 8, Network(2, FAST, FAST), microbatches=(2, 4),
                       top=100)  # every plan gets its causes: ties between the copy and its original sort either way
    return [(c.ranks, c.virtual, c.microbatches, c.balance, c.split, c.result, c.memory_bytes, c.cross_cuts)
            for c in plans if c.schedule == schedule]


# One of each way torch runs a schedule and each placement: a loop over one stage, an action list over stages
# placed in a loop (with --virtual-stages), an action list over stages placed in a V.
@pytest.mark.parametrize("original", ["1f1b", "zero-bubble", "zbv"])
def test_a_schedule_added_to_the_table_alone_is_ordered_planned_predicted_and_calibrated(
        monkeypatch: pytest.MonkeyPatch, original: str) -> None:
    name = f"copy-of-{original}"
    with pytest.raises(ValueError, match=f"unknown schedule '{name}'; choose one of gpipe, 1f1b,"):
        torch_order(name, 2, 4)
    before = _plans(original)
    monkeypatch.setitem(SCHEDULE_SPECS, name, dataclasses.replace(SCHEDULE_SPECS[original], name=name))

    assert torch_order(name, 2, 4) == torch_order(original, 2, 4)
    assert torch_order(name, 2, 4, virtual=4) == torch_order(original, 2, 4, virtual=4)
    assert placement(name, 2, 4) == placement(original, 2, 4)

    copied = _plans(name)  # the planner's default: every schedule in the table
    assert copied and copied == before == _plans(original)

    config = TrainConfig.from_flags(schedule=name, stages=2, microbatches=4, batch_size=8)
    assert job_program(config) == job_program(config.with_flags(schedule=original))

    overheads = {"loop": HostOverhead(action_s=1e-4), "runtime": HostOverhead(action_s=2e-4)}
    assert FAMILIES[name] == FAMILIES[original] and name in FAMILIES
    assert Calibration(Link(2e9, 1e-4), overheads, 2, 1e-5).overhead(name) == overheads[FAMILIES[original]]
    fit = PilotFit({}, overheads)
    assert fit.overhead(name) == overheads[FAMILIES[original]] and fit.source(name) == "family"


def test_a_spec_whose_family_contradicts_its_placement_is_refused():
    with pytest.raises(ValueError, match=r"schedule 'gpipe': torch runs a loop over one stage per rank and an "
                                         r"action list over several, got family 'loop' with placement 'loop'"):
        ScheduleSpec("gpipe", "ScheduleGPipe", "loop", 1, False, "(S-1)/(M+S-1)", "loop")
