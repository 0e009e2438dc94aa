"""The numba.cuda kernels (ColorJitter's and the bundled ones), under the CUDA simulator, agree with the CPU ones.

One subprocess for all of them: NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json
import numpy as np
from numba import cuda
from stallfree.transforms import ColorJitter
from stallfree.transforms.color import jitter_cuda_function
from stallfree.transforms.random import SampleRandom

from numba import config

assert config.ENABLE_CUDASIM
jitter = ColorJitter(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.2)
rng = np.random.default_rng(0)
diffs = []
for sample, (shape, dtype) in enumerate([((5, 7, 3), np.uint8), ((9, 4, 3), np.uint8), ((6, 6, 3), np.float32)]):
    image = rng.integers(0, 256, shape, dtype=np.uint8) if dtype == np.uint8 else rng.random(shape, dtype=np.float32)
    params, _ = jitter.draw(SampleRandom(1, 0, sample), shape[:2])
    order, factors = params["order"], params["factors"]
    out = np.empty_like(image)
    cuda.jit(jitter_cuda_function(dtype == np.uint8))[1, 16](out, image, order, factors)
    cpu = jitter.apply(image, order, factors)
    diffs.append(float(np.abs(out.astype(np.float64) - cpu.astype(np.float64)).max()))
color = diffs

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
print(json.dumps({"color": color, "bundled": diffs}))
"""


def test_cuda_kernels_agree_with_cpu_under_the_simulator() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    diffs = json.loads(done.stdout.strip().splitlines()[-1])
    color, bundled = diffs["color"], diffs["bundled"]
    assert color[0] == 0 and color[1] == 0  # uint8 images: the same grey levels
    assert color[2] <= 1e-6
    assert len(bundled) == 10 and max(bundled) <= 1e-6, bundled
