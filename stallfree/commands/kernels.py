"""The one-time compile of stallfree's Numba kernels, said once instead of hidden behind the first batch.

The resampler's and ColorJitter's DALI entry points (``stallfree.transforms.numba.abi``) compile when a graph first
looks one up after installing or upgrading (a few seconds on 2 cores for the pair a spec uses) and load from Numba's
disk cache afterwards (well under a second). Inside the first batch, the compile showed as a progress bar stuck at
its first step with an ETA of many minutes. A command that builds the Loader's graph calls :func:`announce_compiles`
first, so that a lookup that compiles says so on stderr, once, and how long it took.
"""

from __future__ import annotations

import sys
import threading

__all__ = ["announce_compiles"]


def announce_compiles(show: bool = True) -> None:
    """From now on, say on stderr when a kernel lookup compiles (once), and how long it took; nothing if not ``show``.

    Raises:
        DaliMissing: DALI is not installed (the kernels are DALI operators).
    """
    from stallfree.core.dali import require_dali

    require_dali()
    from stallfree.transforms.numba import abi

    if not show:
        abi.compile_notice = None
        return
    said = threading.Event()

    def notice(event: str, seconds: float) -> None:
        if event == "slow" and not said.is_set():
            said.set()
            print("compiling stallfree's Numba kernels for this graph (once after installing or upgrading, a few "
                  "seconds on 2 cores; later runs load them from Numba's cache)", file=sys.stderr, flush=True)
        elif event == "done":
            print(f"compiled in {seconds:.0f} s", file=sys.stderr, flush=True)

    abi.compile_notice = notice
