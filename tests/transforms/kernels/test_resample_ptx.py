"""Without a GPU: every GPU resampler kernel compiles to PTX through NVVM, where the CUDA toolkit's libnvvm is present.

The simulator runs the kernels as Python and so cannot see what Numba's CUDA target refuses to type: the kernels
once called ``max``/``min``, which numba 0.68's own CUDA target (this venv's; the GPU image has numba-cuda) fails
on ("Signature mismatch: 2 argument types given, but function takes 1 arguments"), and only a GPU run would have
shown it. ``compile_ptx`` is public; a device function asks the current device for its compute capability, so the
subprocess answers for it (sm_80) instead of a driver.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import types as pytypes
import numba.cuda.dispatcher as dispatcher
from numba import cuda, types

dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(8, 0))  # no driver here
from stallfree.transforms.kernels.resample_cuda import KERNELS

u8, f32, i32 = types.uint8[:, :, :], types.float32[:, :, :], types.int32[:]
vec = types.float32[:]
inputs = {"uint8": ([u8, u8], [vec]), "float32": ([u8, f32], [vec]), "normalize": ([u8, u8], [i32, vec])}
for (variant, windowed), run in KERNELS.items():
    out = u8 if variant == "uint8" else f32
    head, tail = inputs[variant]
    ptx, _ = cuda.compile_ptx(run, (out, *head, *([vec] if windowed else []), *tail), cc=(8, 0))
    print(variant, windowed, len(ptx))
"""

NVVM = sorted(glob.glob("/usr/local/cuda*/lib*/libnvvm.so*") + glob.glob("/usr/local/cuda*/nvvm/lib64/libnvvm.so*"))


@pytest.mark.slow
@pytest.mark.skipif(not NVVM, reason="needs the CUDA toolkit's libnvvm (compile_ptx), not a GPU")
def test_every_gpu_resampler_kernel_compiles_to_ptx() -> None:
    home = NVVM[0].split("/lib")[0].split("/nvvm")[0]
    env = {**os.environ, "CUDA_HOME": os.environ.get("CUDA_HOME", home)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 6
