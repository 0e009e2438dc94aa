"""What passes between the Loader's stages: a batch on its way, and the error for a sample that cannot go in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BadSampleError", "Batch"]


class BadSampleError(RuntimeError):
    """A sample that cannot be decoded, with ``source`` (its file or shard row), ``index`` and ``reason``."""

    def __init__(self, source: str, index: int, reason: str):
        super().__init__(f"{source} (sample {index}): {reason}; pass on_error='skip' to skip such samples")
        self.source, self.index, self.reason = source, index, reason

    def __reduce__(self) -> tuple[type[BadSampleError], tuple[str, int, str]]:
        """Pickled with its fields (raised in the training loop when the graph process found it)."""
        return type(self), (self.source, self.index, self.reason)


@dataclass
class Batch:
    """A batch on its way through the stages; ``start``/``end`` are positions in the rank's stream.

    ``fields`` holds what the stages made of its samples' fields, by name (``"image"``: the graph's output); the
    hand-off (:mod:`.assembly`) adds the column fields and gives the batch its public form.
    """

    number: int
    start: int
    end: int
    rows: np.ndarray
    skipped: list[dict[str, Any]] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
