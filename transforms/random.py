"""The sample-keyed random generator: every random parameter is a pure function of (seed, epoch, sample, draw).

A counter-based generator (SplitMix64 over a per-sample key, in the spirit of Salmon et al., "Parallel random
numbers: as easy as 1, 2, 3") makes a sample's augmentation independent of which thread, rank or resume point
handles it. Uniforms for a whole batch are made in one vectorised NumPy call; each sample then reads its own
stream through :class:`SampleRandom`, which extends the stream on demand if a transform needs more draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from stallfree.core.mixer import GOLDEN, finalize

__all__ = ["SampleRandom", "batch_random", "uniforms"]

_GOLDEN = np.uint64(GOLDEN)
_STREAM = 64  # uniforms made per sample up front; enough for every built-in transform chain


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a copy of a uint64 array (:func:`stallfree.core.mixer.finalize`)."""
    return finalize(x.astype(np.uint64, copy=True))


def uniforms(seed: int, epoch: int, samples: Sequence[int] | np.ndarray, count: int, start: int = 0) -> np.ndarray:
    """Uniforms in [0, 1) of shape ``(len(samples), count)``: draw ``start + k`` of each sample's stream."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64) + _GOLDEN)
        key = _mix(key ^ (np.array([epoch & 0xFFFFFFFFFFFFFFFF], np.uint64) * _GOLDEN))
        base = _mix(key ^ _mix(np.asarray(samples, np.uint64) * _GOLDEN + _GOLDEN))
        counters = np.arange(start, start + count, dtype=np.uint64) * _GOLDEN
        bits = _mix(base[:, None] + counters[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class SampleRandom:
    """One sample's random stream, with the draws transforms need (torchvision's names where they exist)."""

    __slots__ = ("_epoch", "_pos", "_sample", "_seed", "_stream")

    def __init__(self, seed: int, epoch: int, sample: int, stream: np.ndarray | None = None):
        self._seed, self._epoch, self._sample = seed, epoch, sample
        self._stream = uniforms(seed, epoch, [sample], _STREAM)[0] if stream is None else stream
        self._pos = 0

    def random(self) -> float:
        """A uniform in [0, 1)."""
        if self._pos == len(self._stream):
            more = uniforms(self._seed, self._epoch, [self._sample], _STREAM, start=len(self._stream))[0]
            self._stream = np.concatenate([self._stream, more])
        value = float(self._stream[self._pos])
        self._pos += 1
        return value

    def uniform(self, low: float, high: float) -> float:
        """A uniform in [low, high)."""
        return low + (high - low) * self.random()

    def log_uniform(self, low: float, high: float) -> float:
        """``exp`` of a uniform in [log(low), log(high)), as torchvision draws aspect ratios."""
        return math.exp(self.uniform(math.log(low), math.log(high)))

    def integers(self, low: int, high: int) -> int:
        """An integer in [low, high)."""
        return low + min(int(self.random() * (high - low)), high - low - 1)

    def permutation(self, n: int) -> list[int]:
        """A uniformly random permutation of ``range(n)`` (Fisher-Yates)."""
        order = list(range(n))
        for i in range(n - 1, 0, -1):
            j = self.integers(0, i + 1)
            order[i], order[j] = order[j], order[i]
        return order


def batch_random(seed: int, epoch: int, samples: Sequence[int] | np.ndarray) -> list[SampleRandom]:
    """One :class:`SampleRandom` per sample, their first draws made in a single vectorised call."""
    streams = uniforms(seed, epoch, samples, _STREAM)
    return [SampleRandom(seed, epoch, int(s), row) for s, row in zip(samples, streams, strict=True)]
