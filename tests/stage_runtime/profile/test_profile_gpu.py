"""The profiler on a real GPU: the ideal step on device tensors, and the Loader's h2d stage in the attribution."""

from __future__ import annotations

from pathlib import Path

import pytest

import stallfree
from stallfree.stage_runtime.profile.phases import build_model, make_train_step, measure_compute


@pytest.mark.gpu
def test_compute_phase_and_real_run_on_cuda(image_folder: Path) -> None:
    from stallfree.transforms import Normalize, RandomResizedCrop

    model = build_model("small_cnn", 3, 32)
    compute = measure_compute("small_cnn", model, "cuda", 4, 32, 3, steps=3)
    assert compute.device == "cuda" and compute.step_s > 0
    loader = stallfree.Loader(image_folder, 4, transform=[RandomResizedCrop(32), Normalize()], device="cuda",
                              placement="cpu", drop_last=True)  # CPU graph, so the copy is a stage of its own
    result = stallfree.profile(loader, make_train_step(model, "cuda"), warmup=1)
    assert result.batches == len(loader) - 1
    assert {"read", "augment", "h2d"} <= set(result.stage_time_per_batch_s)
