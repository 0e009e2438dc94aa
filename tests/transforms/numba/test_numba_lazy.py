"""A new installation compiles only the entry points its graph uses (issue 36, item 4).

Importing the entry points' module (numba_abi then) compiled every resampler and ColorJitter entry point, 20 s of the
first batch on 2 cores where the usual training graph (RandomResizedCrop + flip + Normalize) needs one. Run in a
subprocess with an empty NUMBA_CACHE_DIR, as after installing: nothing compiles on import, and a lookup compiles its own
pair only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import json
from stallfree.transforms.kernels import entries, resample as rk
from stallfree.transforms.numba import abi

state = {"on_import": abi._entry_point.cache_info().currsize}
run, setup = entries.RESIZE_NORMALIZE_ENTRIES[(False, True)]  # whole image, CHW: what a roi-decoded spec uses
state["after_lookup"] = abi._entry_point.cache_info().currsize
state["addresses"] = [run.address != 0, setup.address != 0]
state["again_same"] = entries.RESIZE_NORMALIZE_ENTRIES[(False, True)] == (run, setup)
state["compiled"] = sorted(f.__name__ for f in (rk.resample_normalize_chw, rk.resample_normalize_hwc, rk.resample,
                                                 rk.resample_float) if f.signatures)
print(json.dumps(state))
"""


@pytest.mark.slow
def test_only_the_entry_points_a_graph_looks_up_are_compiled(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.splitlines()[-1])
    assert state["on_import"] == 0
    assert state["after_lookup"] == 2 and state["addresses"] == [True, True] and state["again_same"]
    assert state["compiled"] == ["resample_normalize_chw"], "the other layout, the uint8 and the float resamplers wait"
