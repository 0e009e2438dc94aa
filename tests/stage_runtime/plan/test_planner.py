"""The planner's choices: links, memory and splits decide, from costs given in a file."""

from __future__ import annotations

import json

import pytest

from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.plan.costs import layers_from_json, parse_link, scale_layers
from stallfree.stage_runtime.plan.planner import Network, rank_plans, splits

FAST = parse_link("25GB/s,5us")


def _layers(n: int = 8, act: int = 1_000_000, params: int = 4_000_000) -> list[LayerTimes]:
    return [LayerTimes(1e-3, 2e-3, 1e-3, params, act)] * n


def _plans(cross: str, **kw):
    layers = _layers()
    return rank_plans(lambda b: scale_layers(layers, b / 8), 1e-3, 32, Network(4, FAST, parse_link(cross), 2),
                      microbatches=(4, 8), **kw)


def test_a_20ms_cross_site_link_makes_the_planner_avoid_cutting_across_it():
    fast = _plans("25GB/s,5us")
    slow = _plans("1GB/s,20ms")
    assert fast[0].cross_cuts >= 1 and fast[0].ranks == 4  # with one fabric, all four devices pay off
    assert slow[0].cross_cuts < fast[0].cross_cuts
    assert slow[0].result.step_s > fast[0].result.step_s
    crossing = [c for c in slow if c.cross_cuts]
    assert all(c.result.bubble is None or c.result.bubble.communication > 0.3 for c in crossing[:3])


def test_more_cuts_over_the_slow_link_cost_more():
    slow = [c for c in _plans("1GB/s,20ms") if c.ranks == 4 and c.microbatches == 8]
    by_cuts = {c.cross_cuts: c.result.step_s for c in slow}
    assert len(by_cuts) >= 2
    cuts = sorted(by_cuts)
    assert all(by_cuts[a] < by_cuts[b] for a, b in zip(cuts, cuts[1:], strict=False))


def test_memory_limit_ranks_plans_that_fit_first():
    everything = _plans("25GB/s,5us")
    gpipe = max(c.memory_bytes for c in everything if c.schedule == "gpipe" and c.microbatches == 8 and c.ranks == 4)
    limit = min(max(c.memory_bytes) for c in everything) + 1
    plans = _plans("25GB/s,5us", memory_limit=limit)
    assert plans[0].fits and max(plans[0].memory_bytes) <= limit
    assert not any(c.fits for c in plans if max(c.memory_bytes) > limit)
    assert max(gpipe) > limit  # GPipe holds every micro-batch's activations: the limit excludes it


def test_configurations_torch_refuses_are_skipped_with_its_reason():
    layers = _layers()
    skipped: list[str] = []
    plans = rank_plans(lambda b: layers, 0.0, 32, Network(4, FAST, FAST), schedules=("1f1b",),
                       microbatches=(2,), skipped=skipped)
    assert {c.ranks for c in plans} == {2}
    assert any(s.startswith("1f1b S=4 V=1 M=2:") and "must be greater than" in s for s in skipped)


def test_splits_balance_time_and_the_trainers_rule():
    layers = [LayerTimes(1.0, 2.0, 1.0, 0, 10), LayerTimes(1.0, 2.0, 1.0, 0, 10),
              LayerTimes(3.0, 6.0, 3.0, 0, 10)]
    assert splits(layers, 2)["time"] == (2, 1)
    assert sum(splits(layers, 2)["time+memory"]) == 3


def test_costs_file_scales_with_the_microbatch(tmp_path):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"microbatch": 4, "optimizer_s": 0.5, "layers": [
        {"forward_s": 1.0, "backward_s": 2.0, "param_bytes": 8, "activation_bytes": 40}]}))
    layers, micro, opt = layers_from_json(path)
    assert (micro, opt, layers[0].weight_s) == (4, 0.5, 1.0)
    half = scale_layers(layers, 0.5)[0]
    assert (half.forward_s, half.activation_bytes, half.param_bytes) == (0.5, 20, 8)


@pytest.mark.parametrize(("body", "match"), [
    ("[1]", "non-empty 'layers' list"),
    ('{"layers": [{"forward_s": 1}]}', r"layer 0: 'backward_s' must be a number >= 0, got None"),
    ('{"layers": [{"forward_s": 1, "backward_s": 1, "weight_s": 2, "activation_bytes": 1}]}', "cannot exceed"),
    ("{", "not JSON"),
])
def test_bad_costs_file_names_the_file_and_field(tmp_path, body, match):
    path = tmp_path / "c.json"
    path.write_text(body)
    with pytest.raises(ValueError, match=match):
        layers_from_json(path)
