"""The trainer on CUDA with NCCL: one stage on one GPU, and 2-stage 1F1B where there are two GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.jobs import train


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [1, 2])
def test_trains_on_cuda_with_nccl(tmp_path: Path, stages: int) -> None:
    if torch.cuda.device_count() < stages:
        pytest.skip(f"needs {stages} GPUs (NCCL puts one rank on each), found {torch.cuda.device_count()}")
    summary = train(TrainConfig.from_flags(model="resnet_cifar", samples=512, batch_size=64, microbatches=4,
                                           stages=stages, schedule="1f1b" if stages > 1 else "gpipe", max_steps=6,
                                           device="cuda", progress=False, out_dir=str(tmp_path), timeout_s=120))
    assert summary["steps"] == 6 and summary["eval_top1"] is not None
