"""`stallfree profile DATA` end to end on a tiny image folder: the table, profile.json, trace.json, profile.png."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from stallfree.cli import main
from stallfree.stage_runtime.profile_report import check_schema


@pytest.fixture(scope="module")
def profiled(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("profile-out")
    threads = torch.get_num_threads()
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["profile", str(image_folder), "--batch-size", "4", "--image-size", "32", "--batches", "2",
                     "--threads", "1", "--torch-threads", "1", "--model", "mlp", "--device", "cpu",
                     "--compare", "torch", "--out", str(out)])
    assert code == 0
    assert torch.get_num_threads() == threads  # restored
    return out, buffer.getvalue()


def test_writes_json_matching_its_schema(profiled: tuple[Path, str]) -> None:
    out, _ = profiled
    result = json.loads((out / "profile.json").read_text())
    check_schema(result)
    assert result["phases"]["storage"]["files"] == 24
    assert [p["threads"] for p in result["phases"]["preparation"]["points"]] == [1]
    assert result["phases"]["real_run"]["batches"] == 2
    assert result["stalls"]["bottleneck"] in ("fetch", "preparation", "compute", "input")
    assert set(result["what_if"]) == {"cores", "page_cache", "max_side", "echo"}
    assert result["what_if"]["page_cache"]["fits"] is True
    assert "torch" in result["compare"]
    assert result["resources"] and result["resources"][0]["phase"]


def test_trace_has_the_expected_spans(profiled: tuple[Path, str]) -> None:
    out, _ = profiled
    trace = json.loads((out / "trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {e["name"] for e in complete}
    assert {"storage (cold)", "storage (warm)", "compute (synthetic)", "read", "augment", "step",
            "wait (waiting)"} <= names
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["pid"], int) for e in complete)


def test_png_and_table(profiled: tuple[Path, str]) -> None:
    out, text = profiled
    assert (out / "profile.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "3 compute (ideal)" in text and "bottleneck:" in text and "6 torch DataLoader" in text
    assert "what if: echo=k" in text and "what if: the dataset" in text


def test_too_small_a_dataset_is_a_one_line_error(image_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", str(image_folder), "--batch-size", "16"]) == 2
    assert "profiling needs at least 48 (3 batches of 16): lower --batch-size" in capsys.readouterr().err


def test_bad_option(image_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", str(image_folder), "--batches", "0"]) == 2
    assert "--batches must be >= 1, got 0" in capsys.readouterr().err
