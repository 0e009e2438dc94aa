"""``stallfree bench plan``: the planner's prediction beside the trainer's measurement, and the link calibration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.bench.plan import top_choices
from stallfree.cli import main
from stallfree.stage_runtime.plan.calibrate import calibrate_gloo_link, calibrate_host


@pytest.mark.slow
def test_bench_plan_sets_prediction_beside_measurement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(["bench", "plan", "--models", "mlp", "--schedules", "gpipe", "zbv", "--stages", "2",
                 "--microbatches", "2", "3", "--steps", "2", "--batch-size", "8", "--link", "1GB/s,100us",
                 "--repeats", "2", "--json-file", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    result = json.loads(out.read_text())
    assert result["link"] == "1GB/s,100us" and result["link_source"] == "given"
    assert [(r["schedule"], r["microbatches"]) for r in result["rows"]] == [("gpipe", 2), ("zbv", 2)]
    row = result["rows"][0]
    assert row["measured_step_s"] > 0 and row["predicted_step_s"] > 0 and 0 <= row["predicted_bubble"] <= 1
    assert row["step_error"] == pytest.approx(row["predicted_step_s"] / row["measured_step_s"] - 1)
    assert len(row["runs_step_s"]) == 2  # each job ran twice; the cell is their median
    assert row["runs_spread"] == pytest.approx(max(row["runs_step_s"]) / min(row["runs_step_s"]))
    assert "a cell's 2 runs, slowest over fastest: median" in text and result["median_runs_spread"] >= 1
    assert row["measured_step_s"] == pytest.approx(sum(row["runs_step_s"]) / 2)
    # M=3 does not divide the batch: said, not silently dropped
    assert sorted(s.split(":")[0] for s in result["skipped"]) == ["mlp gpipe S=2 M=3", "mlp zbv S=2 M=3"]
    assert f"{result['within']} of 2 cells within 15% step time" in text
    # the host overhead was calibrated on 2 processes and used; the top choice is reported per model
    overhead = result["calibration"]["2"]["overhead"]
    assert result["overhead_used"] and set(overhead) == {"loop", "runtime"}
    assert min(overhead["loop"]["kind_s"].values()) >= 0 and overhead["loop"]["send_s"] >= 0
    # per action kind and message, measured from the job's spans beside the simulated
    assert set(row["measured_spans"]["per_action_s"]) == set(row["predicted_spans"]["per_action_s"]) == {"F", "B"}
    assert "act 0->1" in row["measured_spans"]["per_message_s"] and "per action kind, message and send" in text
    assert "load average" in text and len(result["load_average"]["start"]) == 3
    assert [t["model"] for t in result["top_choice"]] == ["mlp"] and "mlp: the top choice of 2 cells" in text
    # the simulated ranks share this machine's cores, as the stage processes did
    assert result["cores_shared"] and row["cores"]["count"] >= 1 and "S=2: the simulated ranks share" in text
    # pilots: each schedule's job at its fewest and most micro-batches (M=2 alone here), run again beside the
    # cells, fitted the host overhead each cell was predicted from; the calibration alone is set beside it
    fit = result["pilots"]["2"]["mlp"]
    assert set(fit["schedules"]) == {"gpipe", "zbv"} and set(fit["families"]) == {"loop", "runtime"}
    assert min(fit["schedules"]["gpipe"]["kind_s"].values()) >= 0 and fit["schedules"]["gpipe"]["step_s"] >= 0
    assert [(r["overhead_from"], r["pilot_config"]) for r in result["rows"]] == [("pilots (schedule)", True)] * 2
    assert "predicted_step_s" in row["calibration_only"] and result["within_calibration_only"] is not None
    assert "S=2, mlp: host overhead fitted from pilot jobs (gpipe M=2, zbv M=2" in text
    assert "the same runs predicted from the near-empty pipeline's calibration alone" in text


def test_a_pilot_schedule_that_is_not_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "plan", "--schedules", "gpipe", "--pilot-schedules", "zbv", "--stages", "2"])
    assert code != 0 and "--pilot-schedules zbv: not among --schedules gpipe" in capsys.readouterr().err


def _row(schedule: str, measured: float, predicted: float, model: str = "mlp") -> dict:
    return {"model": model, "schedule": schedule, "stages": 2, "microbatches": 4, "measured_step_s": measured,
            "predicted_step_s": predicted}


def test_the_top_choice_is_the_fastest_predicted_cell_set_beside_the_fastest_measured() -> None:
    rows = [_row("gpipe", 0.010, 0.004), _row("1f1b", 0.0095, 0.005), _row("zbv", 0.012, 0.006),
            _row("gpipe", 0.020, 0.030, "small_cnn"), _row("zbv", 0.030, 0.020, "small_cnn")]
    mlp, cnn = top_choices(rows)
    assert mlp["top"]["schedule"] == "gpipe" and mlp["fastest"]["schedule"] == "1f1b"
    assert mlp["slower_than_fastest"] == pytest.approx(0.010 / 0.0095 - 1) and mlp["within"]  # 5% slower
    assert cnn["top"]["schedule"] == "zbv" and not cnn["within"]  # 50% slower than gpipe


@pytest.mark.slow
def test_the_calibrated_link_is_positive() -> None:
    link = calibrate_gloo_link(repeats=3)
    assert link.bytes_per_s > 0 and 0 < link.latency_s < 1.0


@pytest.mark.slow
def test_the_host_calibration_runs_torchs_schedule_on_every_rank() -> None:
    calibration = calibrate_host(ranks=2, repeats=2, steps=2)
    assert [(p.schedule, p.microbatches) for p in calibration.pipeline] == [
        ("gpipe", 2), ("gpipe", 8), ("interleaved-1f1b", 4), ("zero-bubble", 4)]
    assert all(len(p.records) == 2 and p.schedule_s > 0 for p in calibration.pipeline)
    assert set(calibration.overheads) == {"loop", "runtime"} and calibration.layer_s > 0
    assert dict(calibration.overhead("zbv").kind_s).keys() == {"F", "B", "I", "W"}  # interleaved-1f1b runs B
