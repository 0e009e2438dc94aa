"""What passes between the Loader's stages: a batch on its way, and the error for a sample that cannot go in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["BadSampleError", "Batch"]


class BadSampleError(RuntimeError):
    """A sample that cannot be decoded, with ``source`` (its file or shard row), ``index`` and ``reason``."""

    def __init__(self, source: str, index: int, reason: str):
        super().__init__(f"{source} (sample {index}): {reason}; pass on_error='skip' to skip such samples")
        self.source, self.index, self.reason = source, index, reason


@dataclass
class Batch:
    """A batch on its way through the stages; ``start``/``end`` are positions in the rank's order."""

    number: int
    start: int
    end: int
    rows: np.ndarray
    images: list[np.ndarray] = field(default_factory=list)
    params: dict[str, list[np.ndarray]] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    output: torch.Tensor | None = None
