"""``stallfree profile`` checks its arguments before any phase runs: a device this machine lacks and a model
name that does not resolve end in one line and exit code 2, with no phase's progress printed (issue 35, item 7)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from stallfree.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    pytest.param(["--device", "cuda"], r"--device cuda: torch sees no CUDA GPU on this machine .*use --device cpu",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")),
    (["--model", "resnet19"], r"unknown model 'resnet19': use one of \[.*'resnet18'"),
    (["--model", "no_such_module_xyz:make"], r"--model 'no_such_module_xyz:make': cannot import 'make'"),
])
def test_refused_before_any_phase(image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  argv: list[str], message: str) -> None:
    code = main(["profile", str(image_folder), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("stallfree profile: error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert "storage" not in err and not (tmp_path / "out").exists()
