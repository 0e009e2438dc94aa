"""The one-time compile of stallfree's Numba kernels, said once instead of hidden behind the first batch.

The resampler's and ColorJitter's DALI entry points (``stallfree.transforms.numba_abi``) compile when that module is
first imported after installing or upgrading (about 25 s on 2 cores) and load from Numba's disk cache afterwards
(well under a second). Imported inside the first batch, the compile showed as a progress bar stuck at its first
step with an ETA of many minutes. A command that builds the Loader's graph imports it first, here, and says what
is happening when the import takes longer than loading from the cache does.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time

__all__ = ["load_kernels"]

# Measured on the 2-core development machine (2026-12-05), the import alone, its dependencies already imported:
# 0.29 s from the cache, 22.4 s compiling (NUMBA_CACHE_DIR empty). Longer than this means Numba is compiling.
SLOW_S = 3.0


def load_kernels(show: bool = True) -> None:
    """Import the compiled Numba kernels; if that takes over :data:`SLOW_S`, say on stderr that it is compiling.

    Their dependencies (DALI, Numba, :mod:`stallfree.transforms`) are imported first and not timed, so that a slow
    import of those on a loaded machine is not taken for a compile.

    Raises:
        DaliMissing: DALI is not installed (the kernels are DALI operators).
    """
    from stallfree.core.dali import require_dali

    require_dali()
    importlib.import_module("stallfree.transforms")  # DALI, Numba and the steps: seconds, but no compile; not timed
    said: list[float] = []

    def say() -> None:
        said.append(time.perf_counter())
        print("compiling stallfree's Numba kernels (the resampler, ColorJitter): once after installing or upgrading, "
              "about 25 s on 2 cores; later runs load them from Numba's cache", file=sys.stderr, flush=True)

    start = time.perf_counter()
    timer = threading.Timer(SLOW_S, say)
    timer.daemon = True
    if show:
        timer.start()
    try:
        importlib.import_module("stallfree.transforms.numba_abi")
    finally:
        timer.cancel()
        if show:
            timer.join()  # a message being printed finishes before the next line
    if said:
        print(f"compiled in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
