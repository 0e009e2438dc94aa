"""DALI's type for each NumPy scalar type the graph takes as an input (a step's parameter, a kernel's image)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["dali_type"]


def dali_type(kind: type) -> Any:
    """DALI's type for a NumPy scalar type of a graph input: a step's parameter, or a kernel's image."""
    import nvidia.dali.types as dali_types

    types: Any = dali_types  # DALI's stubs do not list its type constants
    table: dict[Any, Any] = {np.uint8: types.UINT8, np.float32: types.FLOAT, np.float64: types.FLOAT64,
                             np.int32: types.INT32}
    return table[kind]
