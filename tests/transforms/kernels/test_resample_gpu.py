"""On a real GPU: the resampler's numba.cuda kernels give the CPU resampler's pixels to the bit (marked `gpu`).

Two levels: the kernels launched directly on random shapes (every filter, crops, mirrors, both layouts, uint8 and
float32), and DALI's GPU graph against its CPU graph for the fused resize + flip + Normalize that training specs
compile to. The simulator test (test_resample_cudasim) checks the same arithmetic everywhere; this one checks what
only the hardware can change (its own sin/cos, fused multiply-adds).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.dali_types import dali_type
from stallfree.transforms.kernels.filters import FILTERS
from stallfree.transforms.kernels.resample import resample_float, resample_normalize
from stallfree.transforms.random import batch_random

pytestmark = pytest.mark.gpu


def _expected(variant: str, crop: np.ndarray, out_h: int, out_w: int, flags: np.ndarray, mirror: int) -> np.ndarray:
    if variant == "float32":
        out = np.zeros((out_h, out_w, 3), np.float32)
        resample_float(out, crop, bool(flags[0]), int(flags[1]))
        return out
    if variant == "uint8":
        levels = np.zeros((out_h, out_w, 3), np.float32)
        resample_normalize(levels, crop, np.array([0, 0, 0, 1, 1, 1, flags[0], 0, flags[1]], np.float32), False)
        return levels.astype(np.uint8)
    chw = bool(flags[7])
    out = np.zeros((3, out_h, out_w) if chw else (out_h, out_w, 3), np.float32)
    resample_normalize(out, crop, flags, mirror != 0)
    return out


@pytest.mark.parametrize("variant", ["uint8", "normalize", "float32"])
def test_the_kernels_give_the_cpu_pixels_on_the_gpu(variant: str) -> None:
    from numba import cuda

    from stallfree.transforms.kernels.resample_cuda import KERNELS

    rng = np.random.default_rng(7)
    compiled = {windowed: cuda.jit(KERNELS[(variant, windowed)]) for windowed in (False, True)}
    for case in range(512):
        height, width, out_h, out_w = (int(v) for v in rng.integers(1, 200, 4))
        kind, antialias, windowed = int(rng.integers(0, len(FILTERS))), bool(rng.random() < 0.8), case % 3 == 0
        full_h, full_w = height + 7 * windowed, width + 5 * windowed
        top, left = int(rng.integers(0, full_h - height + 1)), int(rng.integers(0, full_w - width + 1))
        if variant == "float32":
            full = rng.normal(0.0, 1.0, (full_h, full_w, 3)).astype(np.float32)
        else:
            full = rng.integers(0, 256, (full_h, full_w, 3), dtype=np.uint8)
        mirror = int(rng.random() < 0.5)
        if variant == "normalize":
            chw = float(rng.random() < 0.5)
            flags = np.array([*rng.uniform(0, 255, 3), *(1 / rng.uniform(10, 80, 3)), antialias, chw, kind], np.float32)
        else:
            flags = np.array([antialias, kind], np.float32)
        expected = _expected(variant, full[top : top + height, left : left + width], out_h, out_w, flags, mirror)
        inputs: list[Any] = [np.zeros((out_h, out_w, 0), np.uint8), full]
        inputs += [np.array([top, left, height, width], np.float32)] if windowed else []
        inputs += [np.array([mirror], np.int32)] if variant == "normalize" else []
        out = cuda.device_array_like(expected)
        compiled[windowed][(8, 32), (32, 8)](out, *[cuda.to_device(a) for a in inputs], cuda.to_device(flags))
        np.testing.assert_array_equal(out.copy_to_host(), expected, err_msg=f"case {case}: {full.shape} -> "
                                      f"{expected.shape}, window {(top, left, height, width)}, flags {flags}")


def _run_graph(steps: list[Any], images: list[np.ndarray], device: str) -> list[np.ndarray]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    compiled = CompiledTransforms(steps, dtype="float32", layout="NCHW")

    @pipeline_def(batch_size=len(images), num_threads=2, device_id=0 if device == "gpu" else None,
                  exec_dynamic=True)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        params = {n: fn.external_source(name=n, dtype=dali_type(k)) for n, k in compiled.param_inputs.items()}
        return compiled.build(source, params, device=device, encoded=False)  # type: ignore[arg-type]

    p = pipe()
    p.build()
    params = compiled.draw(batch_random(3, 0, range(len(images))), [im.shape[:2] for im in images])
    p.feed_input("images", images)
    for name, values in params.items():
        p.feed_input(name, values)
    (out,) = p.run()
    if device == "gpu":
        out = out.as_cpu()
    return [np.array(out[i]) for i in range(len(images))]


@pytest.mark.parametrize("interpolation", list(FILTERS))
def test_the_gpu_graph_resizes_to_the_cpu_graphs_pixels(interpolation: Any) -> None:
    # The fused resize + flip + Normalize: a fn.resize here before differed by up to 22 levels where an axis shrank.
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, s, dtype=np.uint8) for s in [(48, 40, 3), (30, 52, 3), (33, 33, 3), (97, 64, 3)]]
    normalize = Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    for steps in ([RandomResizedCrop(24, interpolation=interpolation), RandomHorizontalFlip(), normalize],
                  [Resize((20, 30), interpolation=interpolation), normalize]):
        cpu, gpu = _run_graph(steps, images, "cpu"), _run_graph(steps, images, "gpu")
        for i, (a, b) in enumerate(zip(cpu, gpu, strict=True)):
            np.testing.assert_array_equal(b, a, err_msg=f"{steps!r}, sample {i}")
