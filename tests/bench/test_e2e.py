"""`stallfree bench e2e`: the result's shape, the chart, and argument errors (no timing assertions: a benchmark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main


def test_a_tiny_sweep_writes_its_json_and_chart(image_folder: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    result_path = tmp_path / "e2e.json"
    code = main(["bench", "e2e", str(image_folder), "--synthetic", "0", "--speeds", "2000", "8000", "--feeds",
                 "stallfree", "dali", "--batch-size", "4", "--batches", "2", "--repeats", "2", "--warmup", "1",
                 "--threads", "1", "--json-file", str(result_path)])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(result_path.read_text())
    assert list(result["feeds"]) == ["stallfree, folder", "plain DALI"]
    target = result["target_speed"]
    assert target > 0 and result["speeds"] == sorted({2000.0, 8000.0, target})  # 80% of stallfree's rate, added
    for feed in result["feeds"].values():
        assert feed["standalone"]["speed"] is None and len(feed["standalone"]["runs"]) == 2
        assert [c["speed"] for c in feed["cells"]] == result["speeds"]
        for cell in [feed["standalone"], *feed["cells"]]:
            assert set(cell) == {"speed", "delivered", "runs", "spread", "stall_share", "cpu_cores"}
            assert 0.0 <= cell["stall_share"] <= 1.0 and cell["cpu_cores"] >= 0.0
            assert cell["spread"][0] <= cell["delivered"] <= cell["spread"][1]
    check = result["target"]
    assert check["speed"] == target and check["torch"] is None and isinstance(check["met"], bool)
    png = tmp_path / "e2e.png"  # beside --json-file
    assert result["png"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "target (issue 11)" in out and "| stallfree, folder" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speeds", "500", "0"], "--speeds must be positive images/s (an accelerator's speed), got [0.0]"),
        (["--speeds", "-250"], "--speeds must be positive images/s"),
        (["--batches", "0"], "--batches must be positive, got 0"),
        (["--repeats", "0"], "--repeats must be positive, got 0"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(image_folder: Path, extra: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "e2e", str(image_folder), "--synthetic", "0", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_folder_smaller_than_one_batch_says_so(image_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "e2e", str(image_folder), "--synthetic", "0", "--batch-size", "1000"]) == 2
    assert "fewer than one batch of 1000" in capsys.readouterr().err
