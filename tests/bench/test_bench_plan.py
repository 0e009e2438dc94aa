"""``stallfree bench plan``: the planner's prediction beside the trainer's measurement, and the link calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.stage_runtime.plan.calibrate import calibrate_gloo_link


def test_bench_plan_sets_prediction_beside_measurement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(["bench", "plan", "--models", "mlp", "--schedules", "gpipe", "zbv", "--stages", "2",
                 "--microbatches", "2", "3", "--steps", "2", "--batch-size", "8", "--link", "1GB/s,100us",
                 "--json-file", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    result = json.loads(out.read_text())
    assert result["link"] == "1GB/s,100us" and result["link_source"] == "given"
    assert [(r["schedule"], r["microbatches"]) for r in result["rows"]] == [("gpipe", 2), ("zbv", 2)]
    row = result["rows"][0]
    assert row["measured_step_s"] > 0 and row["predicted_step_s"] > 0 and 0 <= row["predicted_bubble"] <= 1
    assert row["step_error"] == pytest.approx(row["predicted_step_s"] / row["measured_step_s"] - 1)
    # M=3 does not divide the batch: said, not silently dropped
    assert sorted(s.split(":")[0] for s in result["skipped"]) == ["mlp gpipe S=2 M=3", "mlp zbv S=2 M=3"]
    assert f"{result['within']} of 2 cells within 15% step time" in text


def test_the_calibrated_link_is_positive() -> None:
    link = calibrate_gloo_link(repeats=3)
    assert link.bytes_per_s > 0 and 0 < link.latency_s < 1.0
