from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.schedules import SCHEDULE_SPECS, SCHEDULES, schedule_spec

DOCS = Path(__file__).resolve().parents[2] / "docs" / "train.md"


@pytest.mark.parametrize(("ranks", "m", "want"), [(2, 4, 1 / 5), (4, 4, 3 / 7), (2, 1, 1 / 2), (1, 8, 0.0)])
def test_gpipe_and_1f1b_theory(ranks: int, m: int, want: float) -> None:
    assert schedule_spec("gpipe").bubble(ranks, m) == pytest.approx(want)
    assert schedule_spec("1f1b").bubble(ranks, m) == pytest.approx(want)


def test_interleaving_shrinks_the_bubble() -> None:
    assert schedule_spec("interleaved-1f1b").bubble(4, 8, virtual=2) == pytest.approx(3 / 19)
    assert schedule_spec("zero-bubble").bubble(4, 8) == 0.0


def test_placements() -> None:
    assert [schedule_spec("interleaved-1f1b").owner(s, 2) for s in range(4)] == [0, 1, 0, 1]
    assert [schedule_spec("zbv").owner(s, 2) for s in range(4)] == [0, 1, 1, 0]
    assert [schedule_spec(name).stages_per_rank(3) for name in SCHEDULES] == [1, 1, 3, 3, 2, 1]


def test_bad_names_and_counts_carry_the_fix() -> None:
    with pytest.raises(ValueError, match="choose one of gpipe, 1f1b"):
        TrainConfig.from_flags(schedule="pipedream")
    with pytest.raises(ValueError, match="multiple of the 2 pipeline ranks, got 3; use 4"):
        schedule_spec("interleaved-1f1b").check(2, 3)
    with pytest.raises(ValueError, match="batch_size=30, microbatches=4"):
        TrainConfig.from_flags(batch_size=30, microbatches=4)
    with pytest.raises(ValueError, match=r"schedule 'zbv' needs at least 2 pipeline ranks \(--stages 2\), got 1"):
        TrainConfig.from_flags(schedule="zbv", stages=1)


def test_every_spec_names_a_torch_class_that_takes_what_build_schedule_passes() -> None:
    import inspect

    from torch.distributed import pipelining

    for spec in SCHEDULE_SPECS.values():
        cls = getattr(pipelining, spec.torch_class)
        first = list(inspect.signature(cls.__init__).parameters)[1]
        assert first == ("stage" if spec.placement == "one" else "stages"), (spec.name, first)


def test_the_docs_table_is_the_spec_table() -> None:
    rows = re.findall(r"^\| `([\w-]+)` \| `(\w+)` \| ([^|]+) \| ([^|]+) \|$", DOCS.read_text(), re.M)
    assert [(name, cls) for name, cls, _, _ in rows] == [(s.name, s.torch_class) for s in SCHEDULE_SPECS.values()]
    for name, _, per_rank, theory in rows:
        spec = schedule_spec(name)
        assert per_rank.startswith(str(spec.stages_fixed)) if spec.stages_fixed else per_rank[0] in "`V", per_rank
        assert theory.replace("\u00b7", "*").startswith(spec.bubble_theory), (name, theory)


def test_the_bench_sweep_skips_what_the_config_refuses_and_says_why(tmp_path: Path) -> None:
    # Was: bench/train.py copied the micro-batch rule and missed zbv's two ranks, so
    # `stallfree bench train --stages 1` died on "schedule 'zbv' needs at least 2 pipeline ranks (--stages 2)".
    from stallfree.bench.train import schedule_jobs

    args = argparse.Namespace(schedules=list(SCHEDULES), microbatches=[2, 3], stages=1, batch_size=6, steps=1)
    configs, skipped = schedule_jobs(args, tmp_path)
    made = [(c.pipeline.schedule, c.pipeline.microbatches) for c in configs]
    assert made == [(s, m) for s in SCHEDULES if s != "zbv" for m in (2, 3)]
    assert skipped == ["zbv M=2: schedule 'zbv' needs at least 2 pipeline ranks (--stages 2), got 1",
                       "zbv M=3: schedule 'zbv' needs at least 2 pipeline ranks (--stages 2), got 1"]
    args.stages = 2
    configs, skipped = schedule_jobs(args, tmp_path)
    assert ("interleaved-1f1b", 3) not in [(c.pipeline.schedule, c.pipeline.microbatches) for c in configs]
    assert "interleaved-1f1b M=3: schedule 'interleaved-1f1b' needs --microbatches to be a multiple" in skipped[0]
