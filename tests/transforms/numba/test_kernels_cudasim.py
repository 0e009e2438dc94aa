"""The numba.cuda kernels (ColorJitter's and the bundled ones), under the CUDA simulator, agree with the CPU ones.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so the CUDA side runs in a subprocess; the
CPU side runs here, where the kernels are already compiled by the other tests, and the two meet in .npz files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallfree.transforms import (
    ColorJitter,
    Cutout,
    GaussianNoise,
    RandomErasing,
    RandomGrayscale,
    RandomPosterize,
    RandomSolarize,
)
from stallfree.transforms.random import SampleRandom

pytestmark = pytest.mark.slow  # the CUDA simulator

# Rebuilt identically in the subprocess from this source: (expression, image dtype).
CASES = [
    ("RandomErasing(p=1.0, value=(1, 2, 3))", "uint8"),
    ("RandomErasing(p=1.0, value='random')", "float32"),
    ("Cutout(n_holes=2, length=4)", "uint8"),
    ("GaussianNoise(sigma=0.3)", "uint8"),
    ("GaussianNoise()", "float32"),
    ("RandomSolarize(100, p=1.0)", "uint8"),
    ("RandomSolarize(0.5, p=1.0)", "float32"),
    ("RandomPosterize(2, p=1.0)", "uint8"),
    ("RandomGrayscale(p=1.0)", "uint8"),
    ("RandomGrayscale(p=1.0)", "float32"),
    ("ColorJitter(0.5, 0.5, 0.5, 0.2)", "uint8"),
    ("ColorJitter(0.5, 0.5, 0.5, 0.2)", "float32"),
]
NAMES = {c.__name__: c for c in (ColorJitter, Cutout, GaussianNoise, RandomErasing, RandomGrayscale,
                                   RandomPosterize, RandomSolarize)}

SCRIPT = r"""
import sys
import numpy as np
from numba import config, cuda
from stallfree.transforms import *
from stallfree.transforms.ops.color import jitter_cuda_function

assert config.ENABLE_CUDASIM
data = np.load(sys.argv[1])
cases = [tuple(c.split("|")) for c in data["cases"]]
outs = {}
for i, (expr, dtype) in enumerate(cases):
    step, image = eval(expr), data[f"image{i}"]
    names = [n for n in data.files if n.startswith(f"p{i}.")]
    params = {n.split(".", 1)[1]: data[n] for n in names}
    if isinstance(step, ColorJitter):
        out = np.empty_like(image)
        cuda.jit(jitter_cuda_function(dtype == "uint8"))[1, 16](out, image, params["order"], params["factors"])
    else:
        out = step.apply_cuda(image, params, blocks=(2, 2, 1), threads_per_block=(4, 2, 1))
    outs[f"out{i}"] = out
np.savez(sys.argv[2], **outs)
"""


def _cpu(step: Any, image: np.ndarray, params: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(step, ColorJitter):
        return step.apply(image, params["order"], params["factors"])
    return step.apply(image, params)


def test_cuda_kernels_agree_with_cpu_under_the_simulator(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays: dict[str, Any] = {"cases": np.array([f"{e}|{d}" for e, d in CASES])}
    cpu = []
    for i, (expr, dtype) in enumerate(CASES):
        step = eval(expr, dict(NAMES))  # noqa: S307 - the fixed expressions above
        shape = (11, 7, 3) if i % 2 else (6, 9, 3)
        image = rng.integers(0, 256, shape, dtype=np.uint8) if dtype == "uint8" else rng.random(shape, np.float32)
        params, _ = step.draw(SampleRandom(0, 0, i), shape[:2])
        arrays[f"image{i}"] = image
        arrays.update({f"p{i}.{n}": v for n, v in params.items()})
        cpu.append(_cpu(step, image, params))
    np.savez(tmp_path / "in.npz", **arrays)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    gpu = np.load(tmp_path / "out.npz")
    for i, (expr, dtype) in enumerate(CASES):
        diff = np.abs(gpu[f"out{i}"].astype(np.float64) - cpu[i].astype(np.float64)).max()
        assert diff <= (0 if dtype == "uint8" else 1e-6), (expr, dtype, diff)
