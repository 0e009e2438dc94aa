from __future__ import annotations

import pytest
import torch
from torch import nn

from stallfree.stage_runtime.models.partition import LayerCost, balance_costs, measure_layers, plan, split


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
    # Best of 6: under a loaded machine (CI runs tests in parallel) one preempted repeat must not rank the layers.
    costs = measure_layers(layers, torch.randn(64, 16), repeats=5)
    assert costs[2].param_bytes == (512 * 512 + 512) * 4
    assert costs[1].activation_bytes == 64 * 512 * 4
    assert costs[2].time_s > costs[0].time_s
    stages = split(layers, [2, 2])
    assert stages[1][0] is layers[2]


def test_measure_layers_times_forward_backward_and_weight_gradient_apart() -> None:
    layers = [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10)]
    costs = measure_layers(layers, torch.randn(4, 3, 16, 16), repeats=2)
    for c in costs:
        assert c.forward_s is not None and c.weight_s is not None
        assert 0 < c.forward_s < c.time_s  # time_s, what the split balances by, is still forward + backward
        assert 0 <= c.weight_s <= c.time_s - c.forward_s  # the weight gradient is part of the backward
    conv, relu, flatten, linear = costs
    assert conv.weight_s > 0 and linear.weight_s > 0
    assert relu.weight_s == 0 and flatten.weight_s == 0  # no parameters: all of the backward is the input's


def test_simulator_layer_times_come_from_the_measured_passes() -> None:
    from stallfree.stage_runtime.models.measure import layer_times

    times = layer_times(LayerCost(3.0, 8, 4, forward_s=1.0, weight_s=0.5))
    assert (times.forward_s, times.backward_s, times.weight_s, times.param_bytes, times.activation_bytes) == (
        1.0, 2.0, 0.5, 8, 4)
    with pytest.raises(ValueError, match="has no forward and weight-gradient seconds of its own; measure it"):
        layer_times(LayerCost(3.0, 8, 4))
