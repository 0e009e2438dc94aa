"""The trainer's prediction simulates the layer costs rank 0 measured for the split: the model is measured once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main

pytestmark = pytest.mark.slow  # a training job in spawned processes


def test_the_prediction_uses_rank_0s_measurement_and_measures_nothing_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def measured_twice(*args: object, **kwargs: object) -> None:
        raise AssertionError("the command measured the model again after training")

    # The stage processes are spawned: they import their own, unpatched measure_model.
    monkeypatch.setattr("stallfree.stage_runtime.plan.predict.measure_model", measured_twice)
    code = main(["train", "--synthetic", "64", "--model", "mlp", "--image-size", "8", "--batch-size", "8",
                 "--schedule", "1f1b", "--microbatches", "2", "--max-steps", "2", "--no-progress",
                 "--out", str(tmp_path / "run"), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    costs = summary["layer_costs"]
    assert len(costs["layers"]) == sum(summary["balance"]) and costs["optimizer_s"] >= 0
    assert all(layer["forward_s"] > 0 for layer in costs["layers"])
    predicted = summary["predicted"]
    assert predicted["step_s"] > 0 and predicted["link_source"] == "calibrated"  # a CPU job: link and overhead
    causes = predicted["causes"]
    parts = ("warmup_cooldown", "imbalance", "communication", "runtime")  # runtime: the calibrated host overhead
    assert sum(causes[k] for k in parts) == pytest.approx(
        predicted["bubble"])
