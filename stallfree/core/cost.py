"""What a document costs to train on: ``a * len + b * len**2 + c * images`` (DESIGN.md, "Sample kinds").

The one cost model of token sequences, shared by the Loader's balance (which documents share a row, which rows go
to which rank and micro-batch: :mod:`stallfree.pipeline.balance`), the simulated accelerator (which charges a
micro-batch its cost) and the trainer's books. The linear term is the work per token (the model's matmuls); the
quadratic term is attention, whose work grows with the square of each document's length (a packed row attends
within its documents only); the image term is a vision encoder's work per image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Cost"]


@dataclass(frozen=True)
class Cost:
    """A document of ``len`` tokens and ``k`` images costs ``linear * len + quadratic * len**2 + image * k``.

    Units are the caller's (seconds for a fitted cost, tokens for :meth:`attention`); only ratios matter to the
    balance.
    """

    linear: float = 1.0
    quadratic: float = 0.0
    image: float = 0.0

    def __post_init__(self) -> None:
        for name in ("linear", "quadratic", "image"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Cost {name} must be a finite number >= 0, got {value!r}")
        if self.linear == self.quadratic == self.image == 0:
            raise ValueError("Cost needs a coefficient above 0 (linear, quadratic or image)")

    @classmethod
    def attention(cls, span: int) -> Cost:
        """Per token 1, and attention as costly as the linear part for a document of ``span`` tokens."""
        if isinstance(span, bool) or not isinstance(span, int) or span < 1:
            raise ValueError(f"Cost.attention span must be an int >= 1 (tokens), got {span!r}")
        return cls(1.0, 1.0 / span)

    def document(self, length: int, images: int = 0) -> float:
        """One document's cost."""
        return self.linear * length + self.quadratic * length * length + self.image * images

    def lengths(self, lengths: np.ndarray | Sequence[int], images: np.ndarray | Sequence[int] | None = None) -> float:
        """The summed cost of documents of these lengths (and images)."""
        n = np.asarray(lengths, np.float64)
        total = self.linear * n.sum() + self.quadratic * (n * n).sum()
        return float(total + (self.image * float(np.sum(images)) if images is not None else 0.0))

    @classmethod
    def fit(cls, documents: Sequence[Sequence[int]], seconds: Sequence[float],
            images: Sequence[int] | None = None) -> Cost:
        """The cost whose prediction is nearest to measured times (non-negative least squares).

        Args:
            documents: for each measurement (a step, a micro-batch), the lengths of the documents it held.
            seconds: each measurement's time.
            images: each measurement's image count (``None``: no images, and no image term).

        Raises:
            ValueError: fewer measurements than terms, or lengths of one kind only (nothing tells the terms apart).
        """
        rows = [[float(sum(d)), float(sum(x * x for x in d))] for d in documents]
        if images is not None:
            for row, k in zip(rows, images, strict=True):
                row.append(float(k))
        a = np.asarray(rows, np.float64)
        b = np.asarray(seconds, np.float64)
        if len(a) != len(b) or len(a) < a.shape[1]:
            raise ValueError(f"Cost.fit needs at least {a.shape[1]} measurements, one time each; got {len(a)} "
                             f"documents lists and {len(b)} times")
        coef = _nnls(a, b)
        if not np.any(coef > 0):
            raise ValueError("Cost.fit found no positive term: the times do not grow with the documents measured")
        return cls(*(float(c) for c in coef))


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by active sets over the few terms (2 or 3): every subset, the best feasible."""
    best, best_err = np.zeros(a.shape[1]), float(np.sum(b * b))
    n = a.shape[1]
    for mask in range(1, 1 << n):
        cols = [i for i in range(n) if mask >> i & 1]
        sub = a[:, cols]
        if np.linalg.matrix_rank(sub) < len(cols):
            continue
        coef, *_ = np.linalg.lstsq(sub, b, rcond=None)
        if np.any(coef < 0):
            continue
        full = np.zeros(n)
        full[cols] = coef
        err = float(np.sum((a @ full - b) ** 2))
        if err < best_err:
            best, best_err = full, err
    return best
