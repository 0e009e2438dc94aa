"""The adjustment kernels' numba.cuda form (adjust.py, the distortion's permutation), under the CUDA simulator, agrees
with their CPU form.

NUMBA_ENABLE_CUDASIM must be set before numba.cuda is first imported, so the CUDA side runs in a subprocess; the CPU
side runs here, and the two meet in .npz files. Each case is a kernel and its arguments (image first) in order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

KERNELS = """
from stallfree.transforms.ops import adjust, color
KERNELS = {
    "invert[uint8]": adjust._INVERT["uint8"], "invert[float32]": adjust._INVERT["float32"],
    "autocontrast[uint8]": adjust._AUTOCONTRAST["uint8"], "autocontrast[float32]": adjust._AUTOCONTRAST["float32"],
    "sharpness[uint8]": adjust._SHARPNESS["uint8"], "sharpness[float32]": adjust._SHARPNESS["float32"],
    "equalize.table": adjust._equalize_table, "equalize": adjust._equalize, "permute": color._permute,
}
"""

SCRIPT = KERNELS + r"""
import sys
import numpy as np
from numba import config

assert config.ENABLE_CUDASIM
data = np.load(sys.argv[1])
outs = {}
for i, name in enumerate(data["names"]):
    args = [data[f"a{i}.{k}"] for k in range(int(data["counts"][i]))]
    outs[f"out{i}"] = KERNELS[str(name)].run_cuda(*args, blocks=(2, 2, 1), threads_per_block=(4, 2, 1))
np.savez(sys.argv[2], **outs)
"""


def cases() -> list[tuple[str, list[np.ndarray]]]:
    rng = np.random.default_rng(0)
    u8 = (rng.integers(0, 120, (11, 7, 3)) + 40).astype(np.uint8)
    f32 = (u8 / 255).astype(np.float32)
    on, v1, v2 = np.array([1], np.int32), np.array([1, 1], np.int32), np.array([1, 2], np.int32)
    flat = np.ascontiguousarray(u8.reshape(-1))
    table = np.zeros((1, 256, 3), np.float32)
    out = [("invert[uint8]", [u8, on]), ("invert[float32]", [f32, on]), ("permute", [u8, np.array([1, 2, 0, 1],
                                                                                                  np.int32)])]
    for image in (u8, f32):
        kind = image.dtype.name
        low, high = image.min((0, 1)).astype(np.float32), image.max((0, 1)).astype(np.float32)
        out += [(f"autocontrast[{kind}]", [image, config, low, high]) for config in (v1, v2)]
        out += [(f"sharpness[{kind}]", [image, np.array([1.7, -0.7], np.float32), config]) for config in (v1, v2)]
    out += [("equalize.table", [table, flat, on])]
    return out


@pytest.mark.slow
def test_cuda_kernels_agree_with_cpu_under_the_simulator(tmp_path: Path) -> None:
    namespace: dict[str, Any] = {}
    exec(KERNELS, namespace)  # noqa: S102 - the fixed import above, shared with the subprocess
    kernels = namespace["KERNELS"]
    arrays: dict[str, Any] = {}
    cpu = []
    all_cases = cases()
    for i, (name, args) in enumerate(all_cases):
        arrays.update({f"a{i}.{k}": a for k, a in enumerate(args)})
        cpu.append(kernels[name](*args))
    # the table kernel's output feeds the equalize kernel, as in the graph
    image, table = all_cases[0][1][0], cpu[-1].reshape(-1)
    all_cases.append(("equalize", [image, np.array([1], np.int32), table]))
    arrays.update({f"a{len(cpu)}.{k}": a for k, a in enumerate(all_cases[-1][1])})
    cpu.append(kernels["equalize"](*all_cases[-1][1]))
    arrays["names"] = np.array([name for name, _ in all_cases])
    arrays["counts"] = np.array([len(args) for _, args in all_cases])
    np.savez(tmp_path / "in.npz", **arrays)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    gpu = np.load(tmp_path / "out.npz")
    for i, (name, _) in enumerate(all_cases):
        ours = gpu[f"out{i}"].astype(np.float64)
        assert np.abs(ours - cpu[i].astype(np.float64)).max() <= (1e-6 if "float32" in name else 0), name
