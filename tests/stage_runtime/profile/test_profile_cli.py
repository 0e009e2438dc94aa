"""`stallfree profile DATA` end to end on a tiny image folder: the report, profile.json, trace.json, profile.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from stallfree.cli import main
from stallfree.stage_runtime.profile.report import headline
from stallfree.stage_runtime.profile.schema import check_schema
from stallfree.stage_runtime.profile.text import report


@pytest.fixture(scope="module")
def profiled(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("profile-out")
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        stdout, stderr = _run(patch, ["profile", str(image_folder), "--batch-size", "4", "--image-size", "32",
                                      "--batches", "2", "--threads", "1", "--torch-threads", "1", "--model", "mlp",
                                      "--device", "cpu", "--compare", "torch", "--verify", "echo", "--out",
                                      str(out), "--json", "--json-file", str(out / "copy.json")])
    assert torch.get_num_threads() == threads  # restored
    return out, stdout, stderr


def _run(patch: pytest.MonkeyPatch, argv: list[str]) -> tuple[str, str]:
    import io
    import sys

    stdout, stderr = io.StringIO(), io.StringIO()
    patch.setattr(sys, "stdout", stdout)
    patch.setattr(sys, "stderr", stderr)
    assert main(argv) == 0, stderr.getvalue()
    return stdout.getvalue(), stderr.getvalue()


def _result(profiled: tuple[Path, str, str]) -> dict[str, Any]:
    return json.loads((profiled[0] / "profile.json").read_text())


def test_json_alone_on_stdout_and_the_report_on_stderr(profiled: tuple[Path, str, str]) -> None:
    # Regression (issue 10, item 18): `profile --json` printed the table, then the JSON, on stdout.
    out, stdout, stderr = profiled
    assert json.loads(stdout) == _result(profiled) == json.loads((out / "copy.json").read_text())
    assert "3 compute (ideal)" in stderr and "| phase" not in stdout


def test_writes_json_matching_its_schema(profiled: tuple[Path, str, str]) -> None:
    result = _result(profiled)
    check_schema(result)
    assert result["phases"]["storage"]["files"] == 24
    assert [p["threads"] for p in result["phases"]["preparation"]["points"]] == [1]
    assert result["phases"]["real_run"]["batches"] == 2
    assert set(result["what_if"]) == {"cores", "page_cache", "max_side", "echo", "ray", "observed", "top"}
    assert result["what_if"]["page_cache"]["fits"] is True
    assert "torch" in result["compare"]
    assert result["resources"] and result["resources"][0]["phase"]


def test_the_stalls_agree_with_the_wait_the_run_measured(profiled: tuple[Path, str, str]) -> None:
    s = _result(profiled)["stalls"]
    assert s["measured_stall_share"] == _result(profiled)["phases"]["real_run"]["stall_share"]
    total = s["fetch_stall_share"] + s["prep_stall_share"]
    assert total == pytest.approx(s["measured_stall_share"]) or total == 0.0
    if s["measured_stall_share"] < 0.05:
        assert s["bottleneck"] == "compute" and "stall" not in headline(s)
    elif total > 0:
        assert s["bottleneck"] == ("fetch" if s["fetch_stall_share"] >= s["prep_stall_share"] else "preparation")


def test_each_what_if_states_its_assumption(profiled: tuple[Path, str, str]) -> None:
    w = _result(profiled)["what_if"]
    assert all("real run's stage clock" in w[k]["assumes"] for k in ("cores", "echo"))
    assert "assumes" in w["page_cache"] and ("assumes" in w["max_side"] or "note" in w["max_side"])
    observed = w["observed"]
    run = _result(profiled)["phases"]["real_run"]
    step = run["wall_s"] / run["batches"]
    assert observed["step_s"] == pytest.approx(step)
    # The read stages' time per batch, capped at the loop's pace (spans that held a finished batch behind a full
    # queue would say more: Observed.from_run).
    read = sum(run["stage_time_per_batch_s"].get(stage, 0.0) for stage in ("read", "fetch"))
    assert observed["read_s"] == pytest.approx(min(read, step))


def test_verify_runs_the_what_if_and_prints_predicted_against_measured(profiled: tuple[Path, str, str]) -> None:
    _, _, stderr = profiled
    v = _result(profiled)["verify"]
    k = _result(profiled)["what_if"]["echo"]["k_to_remove_input_stall"]
    assert v["what_if"] == "echo" and v["setting"] == {"echo": max(2, k), "echo_mode": "batch"}
    assert v["run"]["batches"] == 2 and v["measured_images_per_s"] == v["run"]["samples_per_s"] > 0
    assert v["error"] == pytest.approx(v["measured_step_s"] / v["predicted_step_s"] - 1)
    line = next(x for x in stderr.splitlines() if x.startswith("verify echo"))
    assert f"predicted {v['predicted_images_per_s']:.0f} img/s, measured {v['measured_images_per_s']:.0f}" in line


def test_trace_has_the_expected_spans(profiled: tuple[Path, str, str]) -> None:
    out = profiled[0]
    trace = json.loads((out / "trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {e["name"] for e in complete}
    assert {"storage (cold)", "storage (warm)", "compute (synthetic)", "read", "augment", "step",
            "wait (waiting)"} <= names
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["pid"], int) for e in complete)


def test_png_and_report(profiled: tuple[Path, str, str]) -> None:
    out, _, text = profiled
    assert (out / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert headline(_result(profiled)["stalls"]) in text
    assert "3 compute (ideal)" in text and "6 torch DataLoader" in text
    assert "what if: echo=k" in text or "echo=k would not help" in text
    assert "what if: the dataset" in text and ("try first:" in text)


def test_the_report_says_when_the_page_cache_stayed(profiled: tuple[Path, str, str]) -> None:
    # Regression (issue 10, item 21): a warm "cold" read was reported as cold, with nothing said.
    result = _result(profiled)
    note = "could not drop the page cache: 100% of the dataset's pages are still cached"
    result["phases"]["storage"].update(cold_note=note, cache_dropped=False)
    result["phases"]["real_run"].update(cold=False, cold_note=note)
    rows = [line for line in report(result).splitlines() if note in line]
    assert [row.split("|")[1].strip() for row in rows] == ["1 storage, cold", "4 real run"]


def test_too_small_a_dataset_is_a_one_line_error(image_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", str(image_folder), "--batch-size", "16"]) == 2
    assert "profiling needs at least 48 (3 batches of 16): lower the batch size" in capsys.readouterr().err


def test_bad_option(image_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", str(image_folder), "--batches", "0"]) == 2
    assert "batches must be >= 1, got 0" in capsys.readouterr().err
