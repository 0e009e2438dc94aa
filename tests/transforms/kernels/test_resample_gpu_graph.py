"""Without a GPU: a GPU graph's fused resize + flip + Normalize is wired to the resampler's CUDA kernel.

DALI defines a graph symbolically, so the GPU graph of a spec can be defined here (not built or run: that needs a
GPU, test_resample_gpu.py). The DALI operator is replaced by a recorder, which checks what the kernel would get:
the run function, its inputs' types and ranks (one per kernel argument after the output), the device and layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.dali_types import dali_type


def _define(monkeypatch: pytest.MonkeyPatch, steps: list[Any], *, encoded: bool, layout: str = "NCHW",
            device: str = "gpu") -> list[dict[str, Any]]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    from stallfree.transforms.kernels import resample_node

    calls: list[dict[str, Any]] = []

    def record(run_fn: Any, setup_fn: Any, **kwargs: Any) -> Any:
        calls.append({"run_fn": run_fn, **kwargs})
        return lambda *inputs: inputs[1]  # the image: the rest of the graph only needs a node

    monkeypatch.setattr(resample_node, "numba_operator", record)
    compiled = CompiledTransforms(steps, layout=layout)  # type: ignore[arg-type]

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        params = {n: fn.external_source(name=n, dtype=dali_type(k)) for n, k in compiled.param_inputs.items()}
        return compiled.build(source, params, device=device, encoded=encoded)  # type: ignore[arg-type]

    pipe()
    return calls


NORMALIZE = Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@pytest.mark.parametrize("encoded, kernel", [(True, "resize_normalize"), (False, "resize_normalize_window")])
def test_a_gpu_training_spec_runs_the_resamplers_kernel(monkeypatch: pytest.MonkeyPatch, encoded: bool,
                                                        kernel: str) -> None:
    # Encoded: the window is decoded (the whole decoded image is resized); raw pixels: the kernel crops the window.
    steps = [RandomResizedCrop(24, interpolation="lanczos"), RandomHorizontalFlip(), NORMALIZE]
    (call,) = _define(monkeypatch, steps, encoded=encoded)
    assert call["run_fn"].__name__ == kernel and call["device"] == "gpu" and call["layout"] == "CHW"
    assert call["out_type"] is np.float32
    assert call["run_fn"].__code__.co_argcount == len(call["in_types"]) + 1 == len(call["ins_ndim"]) + 1
    window = [np.float32] if not encoded else []
    assert call["in_types"] == [np.uint8, np.uint8, *window, np.int32, np.float32]


def test_a_gpu_resize_then_normalize_in_hwc_runs_the_kernel_unwindowed(monkeypatch: pytest.MonkeyPatch) -> None:
    (call,) = _define(monkeypatch, [Resize((20, 30), interpolation="box"), NORMALIZE], encoded=False, layout="NHWC")
    assert call["run_fn"].__name__ == "resize_normalize" and call["layout"] == "HWC"


def test_the_cpu_graph_keeps_its_cached_cpu_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = [RandomResizedCrop(24), RandomHorizontalFlip(), NORMALIZE]
    (call,) = _define(monkeypatch, steps, encoded=True, device="cpu")
    assert "device" not in call and call["entries"] is not None
