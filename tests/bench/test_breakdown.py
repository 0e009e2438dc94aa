"""`stallfree bench breakdown`: every stage timed, and the sums it reports add up (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main


def test_a_tiny_breakdown_names_every_stage_and_adds_up(image_folder: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    result_path = tmp_path / "breakdown.json"
    code = main(["bench", "breakdown", str(image_folder), "--batch-size", "4", "--batches", "2", "--repeats", "1",
                 "--threads", "1", "--json-file", str(result_path)])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(result_path.read_text())
    assert list(result["loader_us"]) == ["read", "header check", "parameter draws", "decode (crop window)",
                                         "resize, written as float32 NCHW", "flip, normalize", "hand-off to torch"]
    assert result["sum_us"] == pytest.approx(sum(result["loader_us"].values()))
    stages = result["stages_us"]
    assert all(v > 0 for k, v in stages.items() if k != "hand-off to torch")
    assert result["ideal_img_per_s"] == pytest.approx(1e6 / result["sum_us"]) and result["loader_img_per_s"] > 0
    assert "| decode (crop window) |" in out and "the Loader measured" in out


def test_bad_counts_are_one_line(image_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "breakdown", str(image_folder), "--batches", "0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--batch-size, --batches, --repeats and --threads must all be >= 1")
