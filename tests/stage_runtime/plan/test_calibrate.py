"""The calibration's fit: the runtime overhead that made a near-empty pipeline's steps is found again from them."""

from __future__ import annotations

import pytest

from stallfree.stage_runtime.plan.calibrate import MICROBATCHES, PipelineTimes, fit_overhead
from stallfree.stage_runtime.plan.costs import HostOverhead, LayerTimes, Link, stage_costs
from stallfree.stage_runtime.plan.orders import torch_order
from stallfree.stage_runtime.plan.simulate import simulate


def _synthetic(truth: HostOverhead, ranks: int, layer_s: float, link: Link) -> list[PipelineTimes]:
    """What the near-empty pipeline would measure if the simulator were the machine."""
    layer = LayerTimes(layer_s / 3, 2 * layer_s / 3, layer_s / 3, 0, 16)
    costs = stage_costs([layer] * ranks, [1] * ranks)
    out = []
    for m in MICROBATCHES:
        result = simulate(torch_order("gpipe", ranks, m), list(range(ranks)), costs, lambda a, b: link,
                          overhead=truth)
        out.append(PipelineTimes(m, result.schedule_s, result.busy_s))
    return out


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("truth", [HostOverhead(150e-6, 80e-6, 400e-6), HostOverhead(40e-6, 0.0, 0.0),
                                   HostOverhead(0.0, 1e-3, 2e-3)])
def test_the_fitted_overhead_is_the_one_that_made_the_timings(ranks: int, truth: HostOverhead) -> None:
    link = Link(2e9, 60e-6)
    fitted = fit_overhead(_synthetic(truth, ranks, 20e-6, link), 20e-6, link)
    assert fitted.action_s == pytest.approx(truth.action_s, abs=1e-9)
    assert fitted.message_s == pytest.approx(truth.message_s, abs=1e-8)
    assert fitted.step_s == pytest.approx(truth.step_s, abs=1e-7)


def test_timings_no_slower_than_the_bare_simulation_fit_no_overhead() -> None:
    link = Link(2e9, 60e-6)
    fitted = fit_overhead(_synthetic(HostOverhead(), 2, 20e-6, link), 20e-6, link)
    assert fitted.action_s == pytest.approx(0, abs=1e-12) and fitted.message_s == pytest.approx(0, abs=1e-12)
    assert fitted.step_s == pytest.approx(0, abs=1e-12)


def test_one_microbatch_count_is_not_enough_to_fit() -> None:
    one = [PipelineTimes(4, 1e-3, (5e-4, 5e-4))]
    with pytest.raises(ValueError, match=r"two micro-batch counts or more, got \[4\]"):
        fit_overhead(one, 1e-5, Link(1e9, 1e-5))
