"""The keyed counter-based mixer behind every random draw and the sample order: SplitMix64's finaliser.

Every random augmentation parameter is a pure function of ``(seed, epoch, sample, draw)`` and the permutation of an
epoch a keyed bijection of positions (DESIGN.md, "Augmentation randomness is keyed by sample"): both mix 64-bit
words with the output function of SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", 2014). Its constants and the finaliser live here once, for NumPy arrays and for Python ints;
``transforms.numba.kernel`` inlines the same arithmetic in Numba code that runs inside the graph, from these constants.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GOLDEN", "MIX1", "MIX2", "finalize", "splitmix"]

GOLDEN = 0x9E3779B97F4A7C15  # the Weyl increment: 2**64 / the golden ratio, odd
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def finalize(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser applied in place to a uint64 array (wrapping arithmetic, element-wise); returns it."""
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(MIX1)
        z ^= z >> np.uint64(27)
        z *= np.uint64(MIX2)
        z ^= z >> np.uint64(31)
    return z


def splitmix(x: int) -> int:
    """SplitMix64's output for the state before ``x``: the increment added, then the finaliser (Python ints)."""
    x = (x + GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * MIX2) & _MASK64
    return x ^ (x >> 31)
