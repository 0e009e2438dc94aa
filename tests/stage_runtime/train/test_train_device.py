"""A device this machine lacks fails before any work, in one line; a stage that fails before joining the group
still names its cause (issue 35, item 7: "ProcessRaisedException: -- Process 0 terminated with the following
error:;" with the cause lost)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from stallfree.cli import main
from stallfree.core.device import check_device
from stallfree.stage_runtime.train.launcher import launch, one_line

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")


@no_gpu
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_refused_with_the_fix(device: str) -> None:
    with pytest.raises(ValueError, match=rf"--device {device}: torch sees no CUDA GPU .*use --device cpu"):
        check_device(device)


@pytest.mark.parametrize(("device", "message"), [
    ("gpu", r"--device 'gpu' is not a device: use cpu, cuda or cuda:N"),
    ("meta", r"--device 'meta': stallfree runs on cpu or cuda\[:N\], not meta"),
])
def test_a_device_torch_does_not_run_on_is_refused(device: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_device(device)


def test_cpu_and_the_default() -> None:
    assert check_device("cpu") == "cpu"
    assert check_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")


@no_gpu
def test_train_device_cuda_fails_before_any_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--synthetic", "64", "--model", "mlp", "--device", "cuda", "--max-steps", "1",
                 "--no-progress", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "stallfree train: error: --device cuda: torch sees no CUDA GPU" in err
    assert not (tmp_path / "run").exists()  # nothing ran, nothing was written


def test_one_line_of_a_relayed_child_error_is_its_last_line() -> None:
    relayed = mp.ProcessRaisedException(
        "\n\n-- Process 0 terminated with the following error:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n    raise RuntimeError("no NCCL")\nRuntimeError: no NCCL\n', 0, 1)
    assert one_line(relayed) == "RuntimeError: no NCCL"


def _fails_before_its_guard(rank: int) -> None:
    raise RuntimeError(f"rank {rank} could not join the process group")


@pytest.mark.slow
def test_a_rank_failing_outside_its_own_handler_keeps_the_cause() -> None:
    from stallfree.stage_runtime.train.launcher import StageFailure

    with pytest.raises(StageFailure, match=r"pipeline stage 0 \(rank 0\) failed: RuntimeError: rank 0 could not "
                       r"join the process group") as info:
        launch(_fails_before_its_guard, 1, (), stages_of=lambda r: [r])
    assert "ProcessRaisedException" not in str(info.value)


@no_gpu
def test_plan_device_cuda_fails_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--device", "cuda", "--devices", "2", "--out", str(tmp_path / "plan")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "stallfree plan: error: --device cuda: torch sees no CUDA GPU" in err and "--costs FILE" in err
    assert not (tmp_path / "plan").exists()
