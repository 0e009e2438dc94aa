"""The bundled kernels' numba.cuda versions, under the CUDA simulator, agree with the CPU ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json
import numpy as np
from stallfree.transforms import (Cutout, GaussianNoise, RandomErasing, RandomGrayscale, RandomPosterize,
                                  RandomSolarize)
from stallfree.transforms.random import SampleRandom

cases = [
    (RandomErasing(p=1.0, value=(1, 2, 3)), np.uint8), (RandomErasing(p=1.0, value="random"), np.float32),
    (Cutout(n_holes=2, length=4), np.uint8), (GaussianNoise(sigma=0.3), np.uint8), (GaussianNoise(), np.float32),
    (RandomSolarize(100, p=1.0), np.uint8), (RandomSolarize(0.5, p=1.0), np.float32),
    (RandomPosterize(2, p=1.0), np.uint8), (RandomGrayscale(p=1.0), np.uint8), (RandomGrayscale(p=1.0), np.float32),
]
rng = np.random.default_rng(0)
diffs = []
for i, (step, dtype) in enumerate(cases):
    shape = (11, 7, 3)
    image = rng.integers(0, 256, shape, dtype=np.uint8) if dtype == np.uint8 else rng.random(shape, dtype=np.float32)
    params, _ = step.draw(SampleRandom(0, 0, i), shape[:2])
    gpu = step.apply_cuda(image, params, blocks=(2, 2, 1), threads_per_block=(4, 2, 1))
    cpu = step.apply(image, params)
    diffs.append(float(np.abs(gpu.astype(np.float64) - cpu.astype(np.float64)).max()))
print(json.dumps(diffs))
"""


def test_cuda_kernels_agree_with_cpu_under_the_simulator() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    diffs = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(diffs) == 10
    assert max(diffs) <= 1e-6, diffs
