"""The CUDA compiler of a kernel: the pixel function as a ``numba.cuda`` device function in a grid-stride loop.

DALI compiles the run function with ``numba.cuda`` when the GPU graph is built and launches it once per sample;
:func:`launch` runs it directly (a GPU, or the simulator with ``NUMBA_ENABLE_CUDASIM=1``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stallfree.transforms.numba.cpu import expand

__all__ = ["grid_function", "launch"]

_GPU_TEMPLATE = """
def run({args}):
    x0, y0 = _cuda.grid(2)
    sx, sy = _cuda.gridsize(2)
    for y in range(y0, out.shape[0], sy):
        for x in range(x0, out.shape[1], sx):
            _pixel({args_yx})
"""


def grid_function(pixel: Callable[..., None], nparams: int) -> Callable[..., None]:
    """The Python source object of ``run(out, image, *params)``: a grid-stride loop calling ``pixel`` on the GPU."""
    from numba import cuda

    namespace: dict[str, Any] = {"_pixel": cuda.jit(device=True)(pixel), "_cuda": cuda}
    return expand(_GPU_TEMPLATE, nparams, namespace)


def launch(run_fn: Callable[..., None], image: np.ndarray, arrays: Sequence[np.ndarray],
           blocks: Sequence[int], threads_per_block: Sequence[int]) -> np.ndarray:
    """Compile ``run_fn`` with ``numba.cuda`` and launch it on one HWC image; the output image."""
    from numba import cuda

    out = np.empty_like(image)
    cuda.jit(run_fn)[tuple(blocks[:2]), tuple(threads_per_block[:2])](out, image, *arrays)
    return out
