"""The GPU resampler (transforms/kernels/resample_cuda.py), under the CUDA simulator, gives the CPU resampler's pixels
exactly.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so the kernels run in a subprocess; the CPU
side runs here, and the two meet in .npz files. 512 random shapes per variant (every filter, with and without
antialiasing, each axis shrinking, growing or kept, crop windows, mirrors, both layouts), kept tiny because the
simulator runs every thread in Python. The three variants' simulators run at once, one process each, started by one
fixture (the file took 80-89 s when each test ran its own after the other's).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallfree.transforms.kernels.filters import FILTERS
from stallfree.transforms.kernels.resample import resample_float, resample_normalize

pytestmark = pytest.mark.slow  # the CUDA simulator, in subprocesses

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


def _size(rng: np.random.Generator, large: bool = True) -> int:
    # Mostly tiny, now and then (an input axis) larger, so that a strong shrink (wide filters) is covered. An output
    # axis stays tiny: a larger one runs no other code (growing, a filter's support is not widened), and the
    # simulator's time is that of the output pixels, each recomputing its taps (outputs up to 32 were half of it).
    return int(rng.integers(1, 11)) if not large or rng.random() < 0.95 else int(rng.integers(11, 33))


def _case(rng: np.random.Generator, variant: str) -> dict[str, Any]:
    height, width, out_h, out_w = _size(rng), _size(rng), _size(rng, large=False), _size(rng, large=False)
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


VARIANTS = ("uint8", "normalize", "float32")


def _end(process: subprocess.Popen[bytes]) -> None:
    process.kill()  # nothing once it has ended; a simulator a timeout or an error left running stops here
    process.wait()


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[dict[str, Any]], int, str, Path]]:
    """Each variant's cases, and its simulator's exit code, log and outputs: the three simulators run at once."""
    folder = tmp_path_factory.mktemp("cudasim")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    cases, processes = {}, {}
    with contextlib.ExitStack() as stack:
        for variant in VARIANTS:
            rng = np.random.default_rng(VARIANTS.index(variant))
            cases[variant] = [_case(rng, variant) for _ in range(SHAPES)]
            arrays: dict[str, Any] = {"count": np.array(SHAPES)}
            for i, case in enumerate(cases[variant]):
                arrays.update({f"{name}{i}": np.asarray(value) for name, value in case.items()})
            np.savez(folder / f"{variant}.in.npz", **arrays)
            log = stack.enter_context(open(folder / f"{variant}.log", "w"))
            command = [sys.executable, "-c", SCRIPT, str(folder / f"{variant}.in.npz"),
                       str(folder / f"{variant}.out.npz")]
            processes[variant] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            stack.callback(_end, processes[variant])
        codes = {variant: process.wait(timeout=600) for variant, process in processes.items()}
    return {variant: (cases[variant], codes[variant], (folder / f"{variant}.log").read_text()[-3000:],
                      folder / f"{variant}.out.npz") for variant in VARIANTS}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_gpu_resampler_gives_the_cpu_pixels_under_the_simulator(
        simulated: dict[str, tuple[list[dict[str, Any]], int, str, Path]], variant: str) -> None:
    cases, code, log, outputs = simulated[variant]
    assert code == 0, log
    gpu = np.load(outputs)
    shrinking = 0
    for i, case in enumerate(cases):
        out, expected = gpu[f"out{i}"], case["expected"]
        assert out.dtype == expected.dtype and out.shape == expected.shape
        where = f"case {i}: {case['image'].shape} window {case['window']} flags {case['flags']} -> {expected.shape}"
        np.testing.assert_array_equal(out, expected, err_msg=where)
        shrinking += case["size"].shape[0] < case["window"][2] or case["size"].shape[1] < case["window"][3]
    assert shrinking > SHAPES // 4  # the case the GPU's fn.resize got wrong (22 levels) is well covered
