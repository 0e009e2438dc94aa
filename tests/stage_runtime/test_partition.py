from __future__ import annotations

import pytest
import torch
from torch import nn

from stallfree.stage_runtime.train.partition import LayerCost, balance_costs, measure_layers, plan, split


@pytest.mark.parametrize(
    ("costs", "stages", "want"),
    [
        ([1, 1, 1, 1], 2, [2, 2]),
        ([4, 1, 1, 1, 1], 2, [1, 4]),
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, [5, 2, 2]),  # sums 15, 13, 17: the least possible maximum is 17
        ([5, 5, 5], 3, [1, 1, 1]),
    ],
)
def test_balance_minimises_the_heaviest_stage(costs: list[float], stages: int, want: list[int]) -> None:
    got = balance_costs(costs, stages)
    assert sum(got) == len(costs) and len(got) == stages
    heaviest = max(sum(costs[sum(got[:i]):sum(got[:i + 1])]) for i in range(stages))
    assert heaviest == max(sum(costs[sum(want[:i]):sum(want[:i + 1])]) for i in range(stages))


def test_plan_balances_known_costs_and_predicts_stage_times() -> None:
    layers = [nn.Identity() for _ in range(6)]
    costs = [LayerCost(t, 0, 0) for t in (0.4, 0.1, 0.1, 0.1, 0.1, 0.4)]
    partition = plan(layers, 3, costs=costs)
    assert partition.balance == (1, 4, 1)
    assert partition.stage_time_s == pytest.approx((0.4, 0.4, 0.4))
    assert "stage 1: layers 1..4" in partition.describe()


def test_memory_counts_when_times_tie() -> None:
    layers = [nn.Identity() for _ in range(4)]
    costs = [LayerCost(1.0, m, 0) for m in (1000, 0, 0, 0)]
    assert plan(layers, 2, costs=costs, memory_weight=1.0).balance == (1, 3)
    assert plan(layers, 2, costs=costs, memory_weight=0.0).balance == (2, 2)


def test_explicit_balance_is_checked_with_the_fix_in_the_message() -> None:
    layers = [nn.Identity() for _ in range(8)]
    costs = [LayerCost(1.0, 0, 0)] * 8
    with pytest.raises(ValueError, match=r"model: 8 layers, sum of balance: 7"):
        plan(layers, 2, costs=costs, balance=(3, 4))
    with pytest.raises(ValueError, match="3 entries"):
        plan(layers, 2, costs=costs, balance=(3, 4, 1))
    assert plan(layers, 2, costs=costs, balance=(3, 5)).how == "explicit"


def test_too_few_layers() -> None:
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 stages"):
        balance_costs([1, 1], 3)


def test_measure_layers_sees_the_heavy_layer_and_split_shares_modules() -> None:
    layers = [nn.Linear(16, 16), nn.Linear(16, 512), nn.Linear(512, 512), nn.Linear(512, 16)]
    costs = measure_layers(layers, torch.randn(64, 16), repeats=2)
    assert costs[2].param_bytes == (512 * 512 + 512) * 4
    assert costs[1].activation_bytes == 64 * 512 * 4
    assert costs[2].time_s > costs[0].time_s
    stages = split(layers, [2, 2])
    assert stages[1][0] is layers[2]
