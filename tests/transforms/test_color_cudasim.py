"""ColorJitter's numba.cuda kernel, run under the CUDA simulator, agrees with the CPU kernel."""

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

assert cuda.simulator_enabled if hasattr(cuda, "simulator_enabled") else True
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
print(json.dumps(diffs))
"""


def test_cuda_kernel_agrees_with_cpu_under_the_simulator() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    diffs = json.loads(done.stdout.strip().splitlines()[-1])
    assert diffs[0] == 0 and diffs[1] == 0
    assert diffs[2] <= 1e-6
