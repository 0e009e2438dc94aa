"""What the profiler draws and how it grades a comparison (issue 35, item 6): ``profile.png``'s title names the
simulated device and fits, a compute-bound run draws no red bar, ``LoaderProfile.save()`` writes the PNG too,
and loaders compared on one CPU are graded by one yardstick."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from stallfree.stage_runtime.profile.chart import colours, title
from stallfree.stage_runtime.profile.loop import profile
from stallfree.stage_runtime.profile.report import input_cost

PNG = b"\x89PNG\r\n\x1a\n"


def _result(accelerator: dict[str, Any] | None = None) -> dict[str, Any]:
    stalls = {"measured_stall_share": 0.01, "fetch_stall_share": 0.0, "prep_stall_share": 0.0, "bottleneck": "compute",
              "verdict": "not input-bound"}
    result = {"model": "mlp", "device": "cpu", "batch_size": 64, "stalls": stalls}
    return {**result, "accelerator": accelerator} if accelerator else result


def test_the_title_names_the_simulated_device_not_the_model_and_wraps() -> None:
    text = title(_result({"name": "sim:400", "images_per_s": 400.0}), width=60)
    assert text.startswith("a simulated device of 400 img/s (sim:400), batch 64")
    assert "mlp on cpu" not in text
    assert max(len(line) for line in text.splitlines()) <= 60 and "\n" in text  # the headline no longer clipped
    assert title(_result()).startswith("mlp on cpu, batch 64: bottleneck: compute")


def test_no_red_bar_on_a_compute_bound_run() -> None:
    assert "tab:red" not in colours([10.0, 500.0, 90.0], ideal=100.0, input_bound=False)
    assert colours([10.0, 500.0], ideal=100.0, input_bound=True) == ["tab:red", "tab:green"]


@pytest.mark.parametrize(("step_ms", "per_batch_ms", "share", "grade"), [
    (100.0, 100.0, 0.0, "not input-bound"),
    (100.0, 110.0, 1 / 11, "moderately input-bound"),
    (100.0, 200.0, 0.5, "highly input-bound"),
    (100.0, 80.0, 0.0, "not input-bound"),  # faster than the step alone (noise): no cost, not a negative one
])
def test_input_cost_against_the_step_alone(step_ms: float, per_batch_ms: float, share: float, grade: str) -> None:
    run = {"wall_s": 10 * per_batch_ms / 1e3, "batches": 10}
    assert input_cost(step_ms / 1e3, run) == {"input_cost_share": pytest.approx(share), "input_cost_verdict": grade}


def test_the_slower_loader_never_grades_better() -> None:
    # Issue 35: torch's DataLoader at 517 img/s was "not input-bound" (its workers slowed the step instead of
    # making it wait) beside stallfree's "moderately input-bound" at 734; the step alone ran at 1000 img/s.
    ideal = 64 / 1000
    torch_run = {"wall_s": 20 * 64 / 517, "batches": 20, "stall_share": 0.02}
    stallfree_run = {"wall_s": 20 * 64 / 734, "batches": 20, "stall_share": 0.12}
    slow, fast = input_cost(ideal, torch_run), input_cost(ideal, stallfree_run)
    assert slow["input_cost_share"] > fast["input_cost_share"]
    assert slow["input_cost_verdict"] == fast["input_cost_verdict"] == "highly input-bound"


def test_loader_profile_save_writes_json_trace_and_png(tmp_path: Path) -> None:
    result = profile((torch.zeros(4, 3) for _ in range(8)), lambda batch: None, warmup=1)
    written = result.save(tmp_path / "out")
    assert [p.name for p in written] == ["profile.json", "trace.json", "profile.png"]
    assert json.loads(written[0].read_text())["batches"] == 7
    assert "traceEvents" in json.loads(written[1].read_text())
    assert written[2].read_bytes()[:8] == PNG
