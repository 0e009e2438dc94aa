"""``stallfree train --plan plan.json`` runs the plan's best configuration and prints its prediction beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.stage_runtime.plan.handoff import train_settings


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "plan"
    assert main(["plan", "--model", "mlp", "--image-size", "8", "--batch-size", "8", "--devices", "2",
                 "--microbatches", "2,4", "--schedules", "gpipe,1f1b", "--threads", "1", "--no-async",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    return out / "plan.json"


@pytest.mark.slow
def test_train_runs_the_best_plan_and_reports_its_prediction(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _plan(tmp_path, capsys)
    best = json.loads(path.read_text())["best"]
    code = main(["train", "--synthetic", "64", "--plan", str(path), "--max-steps", "2", "--no-progress",
                 "--out", str(tmp_path / "run"), "--json"])
    captured = capsys.readouterr()
    assert code == 0
    summary = json.loads(captured.out)
    config = summary["config"]
    assert (config["model"], config["image_size"], config["schedule"], config["stages"], config["microbatches"],
            config["batch_size"]) == ("mlp", 8, best["schedule"], best["stages"], best["microbatches"], 8)
    assert summary["balance"] == best["balance"]
    assert summary["plan_prediction"]["images_per_s"] == pytest.approx(best["images_per_s"])
    assert "the plan" in captured.err and "predicted" in captured.err and "its rate" in captured.err


def test_a_flag_that_disagrees_with_the_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _plan(tmp_path, capsys)
    stages = json.loads(path.read_text())["best"]["stages"]
    assert main(["train", "--synthetic", "64", "--plan", str(path), "--stages", str(stages + 1)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--stages {stages + 1} disagrees with {path}'s {stages}" in err[0]


@pytest.mark.parametrize(("content", "message"), [
    ("not json", "not a readable plan.json"),
    ('{"format": "other"}', "not a plan of format stallfree-plan/1"),
    ('{"format": "stallfree-plan/1", "best": {"schedule": "1f1b"}}', "the best plan lacks stages"),
])
def test_a_bad_plan_file_is_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        train_settings(path)
    assert str(path) in str(err.value)


@pytest.mark.slow
def test_without_a_plan_the_report_shows_the_simulators_prediction(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--synthetic", "64", "--model", "mlp", "--image-size", "8", "--batch-size", "8",
                 "--schedule", "gpipe", "--microbatches", "2", "--max-steps", "2", "--no-progress",
                 "--out", str(tmp_path / "run"), "--json"])
    captured = capsys.readouterr()
    assert code == 0
    predicted = json.loads(captured.out)["predicted"]
    causes = predicted["causes"]
    parts = causes["warmup_cooldown"] + causes["imbalance"] + causes["communication"] + causes["runtime"]
    assert parts == pytest.approx(predicted["bubble"])
    # GPipe's warm-up/cool-down alone is the textbook (S-1)/(M+S-1) = 1/3 of equal stages: never above it
    assert 0.0 <= causes["warmup_cooldown"] <= 1 / 3 + 1e-9
    # a CPU job calibrates the link and torch's runtime overhead on this machine (gloo)
    assert predicted["link_source"] == "calibrated" and predicted["overhead"]["action_s"] >= 0
    assert "bubble predicted for this split and schedule" in captured.err
