from __future__ import annotations

import pytest

from stallfree.stage_runtime.schedules import (
    SCHEDULES,
    check_microbatches,
    stage_owner,
    stages_per_rank,
    theoretical_bubble,
)
from stallfree.stage_runtime.trainer import TrainConfig


@pytest.mark.parametrize(("ranks", "m", "want"), [(2, 4, 1 / 5), (4, 4, 3 / 7), (2, 1, 1 / 2), (1, 8, 0.0)])
def test_gpipe_and_1f1b_theory(ranks: int, m: int, want: float) -> None:
    assert theoretical_bubble("gpipe", ranks, m) == pytest.approx(want)
    assert theoretical_bubble("1f1b", ranks, m) == pytest.approx(want)


def test_interleaving_shrinks_the_bubble() -> None:
    assert theoretical_bubble("interleaved-1f1b", 4, 8, virtual=2) == pytest.approx(3 / 19)
    assert theoretical_bubble("zero-bubble", 4, 8) == 0.0


def test_placements() -> None:
    assert [stage_owner("interleaved-1f1b", s, 2) for s in range(4)] == [0, 1, 0, 1]
    assert [stage_owner("zbv", s, 2) for s in range(4)] == [0, 1, 1, 0]
    assert [stages_per_rank(name, 3) for name in SCHEDULES] == [1, 1, 3, 3, 2]


def test_bad_names_and_counts_carry_the_fix() -> None:
    with pytest.raises(ValueError, match="choose one of gpipe, 1f1b"):
        TrainConfig(schedule="pipedream")
    with pytest.raises(ValueError, match="multiple of the 2 pipeline ranks, got 3; use 4"):
        check_microbatches("interleaved-1f1b", 2, 3)
    with pytest.raises(ValueError, match="batch_size=30, microbatches=4"):
        TrainConfig(batch_size=30, microbatches=4)
