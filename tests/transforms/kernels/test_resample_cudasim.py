"""The GPU resampler (transforms/kernels/resample_cuda.py), under the CUDA simulator, gives the CPU resampler's pixels
exactly.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so the kernels run in a subprocess; the CPU
side runs here, and the two meet in .npz files. 512 random shapes per variant (every filter, with and without
antialiasing, each axis shrinking, growing or kept, crop windows, mirrors, both layouts), kept tiny because the
simulator runs every thread in Python.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallfree.transforms.kernels.filters import FILTERS
from stallfree.transforms.kernels.resample import resample_float, resample_normalize

SHAPES = 512

SCRIPT = r"""
import sys
import numpy as np
from numba import config, cuda
from stallfree.transforms.kernels.resample_cuda import KERNELS

assert config.ENABLE_CUDASIM
data = np.load(sys.argv[1])
outs = {}
for i in range(int(data["count"])):
    variant, windowed = str(data[f"variant{i}"]), bool(data[f"windowed{i}"])
    inputs = [data[f"size{i}"], data[f"image{i}"]]
    inputs += [data[f"window{i}"]] if windowed else []
    inputs += [data[f"mirror{i}"]] if variant == "normalize" else []
    out = np.zeros_like(data[f"expected{i}"])
    cuda.jit(KERNELS[(variant, windowed)])[(2, 1), (2, 2)](out, *inputs, data[f"flags{i}"])
    outs[f"out{i}"] = out
np.savez(sys.argv[2], **outs)
"""


def _size(rng: np.random.Generator) -> int:
    # Mostly tiny, now and then a larger axis so that a strong shrink (wide filters) is covered.
    return int(rng.integers(1, 11)) if rng.random() < 0.95 else int(rng.integers(11, 33))


def _case(rng: np.random.Generator, variant: str) -> dict[str, Any]:
    height, width, out_h, out_w = (_size(rng) for _ in range(4))
    kind, antialias = int(rng.integers(0, len(FILTERS))), bool(rng.random() < 0.8)
    windowed = bool(rng.random() < 0.3)
    full_h, full_w = height + int(rng.integers(0, 4)) * windowed, width + int(rng.integers(0, 4)) * windowed
    top, left = int(rng.integers(0, full_h - height + 1)), int(rng.integers(0, full_w - width + 1))
    window = np.array([top, left, height, width], np.float32)
    if variant == "float32":
        full = rng.normal(0.0, 1.0, (full_h, full_w, 3)).astype(np.float32)
    else:
        full = rng.integers(0, 256, (full_h, full_w, 3), dtype=np.uint8)
    crop = full[top : top + height, left : left + width]
    case: dict[str, Any] = {"variant": variant, "windowed": windowed, "image": full, "window": window,
                            "size": np.zeros((out_h, out_w, 0), np.uint8)}
    if variant == "normalize":
        chw, mirror = bool(rng.random() < 0.5), int(rng.random() < 0.5)
        mean, std = rng.uniform(0, 255, 3), rng.uniform(10, 80, 3)
        flags = np.array([*mean, *(1.0 / std), antialias, chw, kind], np.float32)
        expected = np.zeros((3, out_h, out_w) if chw else (out_h, out_w, 3), np.float32)
        resample_normalize(expected, crop, flags, mirror != 0)
        case.update(flags=flags, mirror=np.array([mirror], np.int32), expected=expected)
    else:
        flags = np.array([antialias, kind], np.float32)
        if variant == "uint8":
            # The CPU's uint8 resize of any filter: resample_normalize's levels with mean 0 and std 1 (resize_node).
            levels = np.zeros((out_h, out_w, 3), np.float32)
            resample_normalize(levels, crop, np.array([0, 0, 0, 1, 1, 1, antialias, 0, kind], np.float32), False)
            expected = levels.astype(np.uint8)
        else:
            expected = np.zeros((out_h, out_w, 3), np.float32)
            resample_float(expected, crop, antialias, kind)
        case.update(flags=flags, expected=expected)
    return case


@pytest.mark.parametrize("variant", ["uint8", "normalize", "float32"])
def test_the_gpu_resampler_gives_the_cpu_pixels_under_the_simulator(tmp_path: Path, variant: str) -> None:
    rng = np.random.default_rng(["uint8", "normalize", "float32"].index(variant))
    cases = [_case(rng, variant) for _ in range(SHAPES)]
    arrays: dict[str, Any] = {"count": np.array(len(cases))}
    for i, case in enumerate(cases):
        arrays.update({f"{name}{i}": np.asarray(value) for name, value in case.items()})
    np.savez(tmp_path / "in.npz", **arrays)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    gpu = np.load(tmp_path / "out.npz")
    shrinking = 0
    for i, case in enumerate(cases):
        out, expected = gpu[f"out{i}"], case["expected"]
        assert out.dtype == expected.dtype and out.shape == expected.shape
        where = f"case {i}: {case['image'].shape} window {case['window']} flags {case['flags']} -> {expected.shape}"
        np.testing.assert_array_equal(out, expected, err_msg=where)
        shrinking += case["size"].shape[0] < case["window"][2] or case["size"].shape[1] < case["window"][3]
    assert shrinking > SHAPES // 4  # the case the GPU's fn.resize got wrong (22 levels) is well covered
