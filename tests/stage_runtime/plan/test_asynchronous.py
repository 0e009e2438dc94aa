"""No-flush schedules: throughput without the bubble, paid for in weight versions and staleness."""

from __future__ import annotations

import pytest

from stallfree.stage_runtime.plan.asynchronous import predict_simulated_job, simulate_async
from stallfree.stage_runtime.plan.costs import FREE_LINK, StageCost
from stallfree.stage_runtime.plan.orders import torch_order
from stallfree.stage_runtime.plan.simulate import simulate

FREE = lambda a, b: FREE_LINK  # noqa: E731
COSTS = [StageCost(1.0, 2.0, 1.0, 10, 1, 100, 0.0)] * 4


@pytest.mark.parametrize("name", ["pipedream-2bw", "async-1f1b"])
def test_no_flush_removes_the_bubble_in_the_steady_state(name):
    result = simulate_async(name, 4, 8, 8, COSTS, FREE)
    assert result.step_s == pytest.approx(8 * 3.0)  # M x (F + B): every rank busy all the time
    flushed = simulate(torch_order("1f1b", 4, 8), [0, 1, 2, 3], COSTS, FREE).step_s
    assert result.step_s < flushed


def test_2bw_keeps_two_versions_and_is_one_update_stale_before_the_last_stage():
    result = simulate_async("pipedream-2bw", 4, 8, 8, COSTS, FREE)
    # The last stage runs each backward right after its forward, so no update falls in between.
    assert result.weight_versions == (2, 2, 2, 1)
    assert result.staleness == (1, 1, 1, 0)
    assert result.memory_bytes[0] == (2 + 2) * 100 + result.result.peak_activation_bytes[0]


def test_async_1f1b_is_stale_by_the_backwards_in_flight():
    result = simulate_async("async-1f1b", 4, 8, 8, COSTS, FREE)
    assert result.staleness == (3, 2, 1, 0)  # S - 1 - r updates land between a forward and its backward
    assert result.weight_versions == (1, 1, 1, 1)


def test_async_updates_cost_an_optimizer_step_each():
    costly = [StageCost(1.0, 2.0, 1.0, 10, 1, 100, 0.5)] * 4
    per_step = simulate_async("pipedream-2bw", 4, 8, 8, costly, FREE).step_s
    per_micro = simulate_async("async-1f1b", 4, 8, 8, costly, FREE).step_s
    assert per_step == pytest.approx(8 * 3.0 + 0.5)
    assert per_micro == pytest.approx(8 * 3.5)


def test_async_rejects_what_it_cannot_simulate():
    with pytest.raises(ValueError, match="choose one of pipedream-2bw, async-1f1b"):
        simulate_async("xpipe", 4, 8, 8, COSTS, FREE)
    with pytest.raises(ValueError, match="one stage per rank"):
        simulate_async("async-1f1b", 2, 8, 8, COSTS, FREE)


def test_a_simulated_device_job_is_predicted_without_a_bubble_for_2bw_and_1f1b_s_for_1f1b():
    from stallfree.stage_runtime.config.train_config import TrainConfig

    config = TrainConfig.from_flags(model="mlp", stages=2, microbatches=4, batch_size=32, schedule="2bw",
                                    accelerator="sim:200")
    layer = {"forward_s": 1e-3, "backward_s": 2e-3, "weight_s": 1e-3, "param_bytes": 100, "activation_bytes": 10}
    summary = {"balance": [1, 1], "layer_costs": {"layers": [layer, layer], "optimizer_s": 0.0}}
    predicted = predict_simulated_job(config, summary)
    # equal stages of 8 images / 200 img/s = 40 ms each per micro-batch: 2BW's step is M x 40 ms, the device's rate
    assert predicted["2bw"]["images_per_s"] == pytest.approx(200.0)
    assert predicted["2bw"]["bubble"] == pytest.approx(0.0, abs=1e-9)
    assert predicted["2bw"]["weight_versions"] == [2, 1] and not predicted["2bw"]["simulated_only"]
    # 1F1B flushes: (M + S - 1) slots of 40 ms per step, a bubble of (S-1)/(M+S-1)
    assert predicted["1f1b"]["images_per_s"] == pytest.approx(32 / 0.2)
    assert predicted["1f1b"]["bubble"] == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="needs a --accelerator sim:R job"):
        predict_simulated_job(TrainConfig.from_flags(model="mlp", schedule="2bw"), summary)


def test_a_token_jobs_steady_state_charges_its_mean_micro_batch_work():
    # Issue 48: under sim:R a token micro-batch takes its tokens' cost over R, not its rows over R
    from stallfree.stage_runtime.config.train_config import TrainConfig

    config = TrainConfig.from_flags(model="gpt_tiny", seq_len=32, schedule="2bw", stages=2, batch_size=8,
                                    microbatches=4, accelerator="sim:200")
    layer = {"forward_s": 1e-3, "backward_s": 2e-3, "weight_s": 1e-3, "param_bytes": 100, "activation_bytes": 10}
    summary = {"balance": [1, 1], "layer_costs": {"layers": [layer, layer], "optimizer_s": 0.0},
               "micro_batch_work": 80.0}  # 2 rows of 32 tokens with their attention: 80 tokens of work
    predicted = predict_simulated_job(config, summary)
    # equal stages of 80 / 200 = 0.4 s each per micro-batch: 2BW's step is M x 0.4 s
    assert predicted["2bw"]["step_s"] == pytest.approx(4 * 0.4)
