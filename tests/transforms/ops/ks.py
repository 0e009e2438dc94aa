"""The two-sample Kolmogorov-Smirnov statistic the draw tests compare stallfree's draws with torchvision's by."""

from __future__ import annotations

import numpy as np


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The largest gap between the empirical CDFs of ``a`` and ``b``."""
    grid = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())
