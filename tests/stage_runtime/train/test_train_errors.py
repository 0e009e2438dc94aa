"""A job that cannot run says why in one line: before any process is spawned when the arguments show it, and
with the failing stage, its exception type and message when a stage process raises."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.jobs import train
from stallfree.stage_runtime.train.launcher import StageFailure

SMALL = ["--model", "mlp", "--image-size", "4", "--batch-size", "8", "--max-steps", "1", "--no-progress"]

# A user model whose layer 2 raises in its forward on rank 1 (rank 0 measures every layer for the split).
FAULTY = """
import os
from torch import nn

class Boom(nn.Module):
    def forward(self, x):
        if os.environ.get("RANK") == "1":
            raise RuntimeError("boom in the second stage")
        return x

def model(num_classes=10, image_size=4):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * image_size * image_size, 8), Boom(),
                         nn.Linear(8, num_classes))
"""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["/no/such/folder", *SMALL], r"training data /no/such/folder: .*does not exist"),
        (["--synthetic", "64", "--eval", "/no/such/val", *SMALL], r"--eval /no/such/val: .*does not exist"),
        (["EMPTY", *SMALL], r"training data .*empty: .*no class sub-folders"),
        (["--synthetic", "64", "--stages", "9", *SMALL], r"--stages 9 .* 9 model stages but mlp has 6 layers"),
        (["--synthetic", "64", "--balance", "1,1", *SMALL], r"--balance 1,1 sums to 2 but mlp has 6 layers"),
        (["--synthetic", "64", "--balance", "1,2,3", *SMALL], r"--balance 1,2,3 has 3 entries but .* 2 model stages"),
    ],
)
def test_bad_arguments_fail_before_spawning_in_one_line(argv: list[str], message: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    argv = [str(tmp_path / "empty") if a == "EMPTY" else a for a in argv]
    assert main(["train", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(message, err), err


@pytest.mark.slow
def test_exception_in_a_stage_names_the_stage_type_and_message(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "faulty_model.py").write_text(FAULTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = TrainConfig.from_flags(model="faulty_model:model", balance=(2, 2), samples=32, batch_size=8,
                                    microbatches=2, image_size=4, max_steps=2, progress=False, timeout_s=60,
                                    out_dir=str(tmp_path / "run"))
    with pytest.raises(StageFailure, match=r"^pipeline stage 1 \(rank 1\) failed: "
                       r"RuntimeError: boom in the second stage$") as failure:
        train(config)
    assert failure.value.rank == 1
    sys.modules.pop("faulty_model", None)


@pytest.mark.slow
def test_failure_without_a_checkpoint_does_not_claim_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "faulty_model.py").write_text(FAULTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    code = main(["train", "--synthetic", "32", "--model", "faulty_model:model", "--balance", "2,2",
                 "--image-size", "4", "--batch-size", "8", "--microbatches", "2", "--max-steps", "2",
                 "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "RuntimeError: boom in the second stage" in err
    assert "intact" not in err and f"no checkpoint was written under {out / 'checkpoints'}" in err
    sys.modules.pop("faulty_model", None)
