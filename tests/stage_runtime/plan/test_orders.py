"""The orders come from torch's schedule objects; the single-stage ones from running torch's own loop."""

from __future__ import annotations

import pytest

from stallfree.stage_runtime.plan.orders import Op, placement, torch_order

ALL = ["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv"]


def _text(ops):
    return " ".join(map(str, ops))


@pytest.mark.parametrize(("ranks", "m"), [(2, 2), (3, 5), (4, 8)])
def test_gpipe_runs_every_forward_then_every_backward(ranks, m):
    for r, ops in torch_order("gpipe", ranks, m).items():
        assert ops == [Op(r, "F", i) for i in range(m)] + [Op(r, "B", i) for i in range(m)]


@pytest.mark.parametrize(("ranks", "m"), [(2, 2), (3, 5), (4, 8)])
def test_1f1b_warms_up_with_one_forward_per_rank_below(ranks, m):
    # The drawing in stage_runtime/schedules.py: rank r runs S - r forwards, then one backward, one forward...
    for r, ops in torch_order("1f1b", ranks, m).items():
        warm = min(m, ranks - r)
        expected = [Op(r, "F", i) for i in range(warm)]
        for i in range(m):
            expected.append(Op(r, "B", i))
            if warm + i < m:
                expected.append(Op(r, "F", warm + i))
        assert ops == expected, f"rank {r}: {_text(ops)}"


def test_1f1b_last_rank_is_what_runs_not_torchs_published_pipeline_order():
    # torch 2.13's Schedule1F1B.pipeline_order lists '3F1 3B0 ... 3F4' on the last rank of 4 (micro-batch 4 of
    # 0..3); the loop it runs does 3F0 3B0 3F1 3B1 ...: the order is recorded from the loop.
    assert _text(torch_order("1f1b", 4, 4)[3]) == "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3"


def test_1f1b_needs_as_many_microbatches_as_ranks():
    with pytest.raises(ValueError, match="must be greater than"):
        torch_order("1f1b", 4, 2)


@pytest.mark.parametrize("schedule", ALL)
@pytest.mark.parametrize(("ranks", "m"), [(2, 4), (4, 8)])
def test_every_stage_runs_each_microbatch_once_on_its_rank(schedule, ranks, m):
    order = torch_order(schedule, ranks, m, 2)
    stages = ranks * (1 if schedule in ("gpipe", "1f1b") else 2)
    owner = placement(schedule, ranks, stages)
    split = schedule in ("zero-bubble", "zbv")
    for r, ops in order.items():
        assert all(owner[o.stage] == r for o in ops)
        kinds = ("F", "I", "W") if split else ("F", "B")
        assert sorted((o.stage, o.kind, o.mb) for o in ops) == sorted(
            (s, k, i) for s in range(stages) if owner[s] == r for k in kinds for i in range(m))


def test_multi_stage_orders_are_torchs_compute_actions():
    from torch.distributed import pipelining

    from stallfree.stage_runtime.plan.orders import _StandIn  # the stand-in stage is the seam under test

    mine = [_StandIn(s, 4, 2, 0) for s in (0, 2)]
    built = pipelining.ScheduleInterleaved1F1B(mine, 4, loss_fn=lambda *_: None)
    torch_ops = [str(a) for a in built.pipeline_order[1] if a is not None]
    assert _text(torch_order("interleaved-1f1b", 2, 4, 2)[1]).split() == torch_ops


def test_unknown_schedule_names_the_choices():
    with pytest.raises(ValueError, match="choose one of gpipe, 1f1b"):
        torch_order("pipedream", 2, 4)
