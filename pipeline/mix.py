"""Mixtures: several sources sampled by weight into one order, deterministically per ``(seed, epoch)``.

``Mix({"a": src_a, "b": src_b}, weights={"a": 3, "b": 1})`` is a source of the Loader. What an epoch of it is
follows MosaicML Streaming's ``proportion`` (and Megatron-Energon's ``blend_epochized``): an epoch is a fixed number
of samples, ``epoch_size`` (by default every source's rows together), and each source has a fixed **quota** of it,
its weight's share apportioned by largest remainder (:func:`quotas`). Without ``weights`` the quotas are the
sources' sizes: every sample of every source exactly once per epoch.

**Each source reads its own passes.** Source ``s`` (``n`` rows) draws from an endless stream of passes, each a
permutation of its rows keyed by ``(seed, s, pass)``; epoch ``e`` takes the stream's next ``quota`` samples, those at
stream positions ``e * quota ... (e + 1) * quota - 1`` (pass ``j // n``, that pass's position ``j % n``). A source
whose quota is below its size (downsampled) goes on through its pass in the next epoch; one above (upsampled) starts
its next permutation within the epoch. Either way every sample of a source is drawn exactly once per pass of it::

    n_a = 5, quota 3 per epoch      epoch 0: a3 a0 a4 | epoch 1: a1 a2 · a0' | epoch 2: a4' a2' a3' ...
                                    (pass 0: a3 a0 a4 a1 a2; pass 1: a0' a4' a2' a3' a1'; ...)

**The interleaving rule** (a stride schedule, deterministic and low-discrepancy): within an epoch, source ``s``'s
``k``-th sample sits at time ``(k + 1/2) / quota_s``, and the epoch's order is every source's samples sorted by time,
ties to the source earlier in the Mix::

    quotas a=3, b=1     times a: 1/6 1/2 5/6   b: 1/2     order: a a b a

Among the first ``T`` samples of an epoch, source ``s``'s count is within ``1/2 + k * quota_s / (2 * epoch_size)`` of
``T * quota_s / epoch_size`` for ``k`` sources (each source's count is within 1/2 of its time-share, and the times
within ``k / 2`` of ``T / epoch_size``); the last ``T`` alike. So in any ``N`` consecutive samples, inside an epoch
or across epochs' boundaries, a source's count is within ``1 + k * quota_s / epoch_size`` of ``N * quota_s /
epoch_size``, and ``quota_s / epoch_size`` is within ``1 / epoch_size`` of its weight: over 1,000 samples, within 1.1
points of the weight for up to 9 sources and an epoch of 1,000 samples or more.

The order is what the sampler packs (:mod:`.packing`), or deals a document at a time for padded batches
(:class:`MixSamples`): ids are *virtual*, ``row + rows * pass`` for the Mix's row
``row`` (the sources' rows one after another, in the Mix's order) so that an upsampled document drawn twice in an
epoch has two ids; its row is ``id % rows``. The rule knows only counts and rows, never what a sample holds, so a
source of another kind (image-text samples) mixes by the same rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from stallfree.core.mixer import GOLDEN, splitmix
from stallfree.pipeline.arguments import is_int
from stallfree.pipeline.permutation import Permutation

__all__ = ["Mix", "MixOrder", "MixSamples", "quotas"]

_MASK64 = (1 << 64) - 1


class Mix:
    """Several sources mixed by weight: ``Loader(Mix({"a": src_a, "b": src_b}, weights={"a": 0.7, "b": 0.3}), ...)``.

    Args:
        sources: each source by name, in the order that numbers them (a batch's ``dataset`` field is that number):
            anything the Loader opens (a token shard folder, a JSONL/Parquet file, a ``datasets.Dataset``, a Reader).
        weights: each source's share of an epoch's samples (any non-negative numbers, not all zero; normalised).
            ``None``: every source's sample exactly once per epoch (shares as the sizes).
        epoch_size: samples per epoch over all sources (default: the sources' rows together).

    Raises:
        ValueError: an empty mix, a name that is not a non-empty string, weights naming unknown sources or missing
            some, a negative or non-finite weight, weights that sum to zero, or ``epoch_size`` below 1.
        TypeError: ``sources`` or ``weights`` not a dict, or a weight that is not a number.
    """

    def __init__(self, sources: Mapping[str, Any], weights: Mapping[str, float] | None = None, *,
                 epoch_size: int | None = None):
        if not isinstance(sources, Mapping):
            raise TypeError(f"Mix sources must be a dict of name: source, got {type(sources).__name__}")
        if not sources:
            raise ValueError("Mix sources is empty: give at least one source, Mix({'name': source, ...})")
        for name in sources:
            if not isinstance(name, str) or not name:
                raise ValueError(f"Mix sources: every name must be a non-empty string, got {name!r}")
            if isinstance(sources[name], Mix):
                raise ValueError(f"Mix sources[{name!r}] is a Mix itself: give its sources to this Mix directly, "
                                 "with weights multiplied out")
        self.sources: dict[str, Any] = dict(sources)
        self.weights: dict[str, Fraction] | None = None if weights is None else _weights(weights, list(sources))
        if epoch_size is not None and (not is_int(epoch_size) or epoch_size < 1):
            raise ValueError(f"Mix epoch_size must be an int >= 1 (samples per epoch), got {epoch_size!r}")
        self.epoch_size = None if epoch_size is None else int(epoch_size)

    @property
    def names(self) -> list[str]:
        """The sources' names, in the Mix's order (a batch's ``dataset`` is a position in this list)."""
        return list(self.sources)

    def quotas(self, sizes: list[int]) -> list[int]:
        """Each source's samples per epoch, given the sources' sizes (rows) in the Mix's order."""
        if self.weights is None:
            return list(sizes) if self.epoch_size is None else quotas(self.epoch_size, [Fraction(n) for n in sizes])
        return quotas(sum(sizes) if self.epoch_size is None else self.epoch_size, list(self.weights.values()))

    def __repr__(self) -> str:
        weights = None if self.weights is None else {k: float(v) for k, v in self.weights.items()}
        return f"Mix({self.names}, weights={weights}, epoch_size={self.epoch_size})"


def _weights(weights: Mapping[str, Any], names: list[str]) -> dict[str, Fraction]:
    if not isinstance(weights, Mapping):
        raise TypeError(f"Mix weights must be a dict of name: weight, got {type(weights).__name__}")
    unknown = [k for k in weights if k not in names]
    if unknown:
        raise ValueError(f"Mix weights name {unknown}, which are not sources of the Mix (its sources: {names})")
    missing = [k for k in names if k not in weights]
    if missing:
        raise ValueError(f"Mix weights lack {missing}: give every source a weight (0 leaves one out)")
    out: dict[str, Fraction] = {}
    for name in names:
        value = weights[name]
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating, Fraction)):
            raise TypeError(f"Mix weights[{name!r}] must be a number, got {value!r}")
        if not math.isfinite(float(value)) or value < 0:
            raise ValueError(f"Mix weights[{name!r}] must be a finite number >= 0, got {value!r}")
        out[name] = Fraction(value) if not isinstance(value, (np.integer, np.floating)) else Fraction(value.item())
    if sum(out.values()) == 0:
        raise ValueError(f"Mix weights sum to zero ({weights}): give at least one source a weight above 0")
    return out


def quotas(total: int, weights: list[Fraction]) -> list[int]:
    """``total`` apportioned by ``weights`` (largest remainder; equal remainders to the earlier source): exact."""
    scale = sum(weights)
    exact = [w * total / scale for w in weights]
    out = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda s: (-(exact[s] - out[s]), s))
    for s in by_remainder[: total - sum(out)]:
        out[s] += 1
    return out


@dataclass(frozen=True)
class MixOrder:
    """The documents of a Mix in each epoch's order (the whole job's, before packing and dealing to ranks).

    Args:
        sizes: each source's rows, in the Mix's order.
        quotas: each source's samples per epoch (:func:`quotas`).
        shuffle: each pass of a source a fresh permutation; ``False``: row order.
        seed: the job's seed (each source's passes are keyed by it and the source's position).
    """

    sizes: tuple[int, ...]
    quotas: tuple[int, ...]
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.quotas):
            raise ValueError(f"MixOrder has {len(self.sizes)} sizes but {len(self.quotas)} quotas")
        if sum(self.quotas) < 1:
            raise ValueError("a Mix's epoch holds no sample: every weighted source is empty")

    @property
    def num_rows(self) -> int:
        """The Mix's rows: every source's, one after another."""
        return sum(self.sizes)

    @property
    def offsets(self) -> np.ndarray:
        """Source ``s``'s rows are ``offsets[s]:offsets[s + 1]`` of the Mix's."""
        return np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    @property
    def epoch_size(self) -> int:
        """Samples per epoch over all sources."""
        return sum(self.quotas)

    # The order of the whole job, as a sampler's of rank 0 of 1 (:class:`~stallfree.pipeline.sampler.Order`): the
    # packs made of it are what is dealt to ranks (:class:`~stallfree.pipeline.packing.PackOrder`).
    @property
    def rank(self) -> int:
        """0: the order is the whole job's."""
        return 0

    @property
    def world_size(self) -> int:
        """1: the order is the whole job's."""
        return 1

    def total(self, epoch: int = 0) -> int:
        """Samples per epoch (:attr:`epoch_size`, whatever the epoch)."""
        return self.epoch_size

    def length(self, start: int, world_size: int | None = None, epoch: int = 0) -> int:
        """Samples from position ``start`` on, split over ``world_size`` ranks (1), rounded up."""
        return -(-max(0, self.epoch_size - start) // (world_size or 1))

    def rows(self, virtual: np.ndarray) -> np.ndarray:
        """The Mix's rows of virtual ids."""
        return virtual % self.num_rows

    def planned_for(self, world_size: int | None) -> MixOrder:
        """Itself: the order does not depend on the world size."""
        return self

    def sources(self, epoch: int) -> np.ndarray:
        """The source of each position of ``epoch``'s order (the stride schedule; the same every epoch)."""
        return self._schedule()[0]

    def _schedule(self) -> tuple[np.ndarray, np.ndarray]:
        """Each position's source and the rank ``k`` of its sample among that source's in the epoch."""
        source = np.concatenate([np.full(q, s, np.int64) for s, q in enumerate(self.quotas)])
        k = np.concatenate([np.arange(q, dtype=np.int64) for q in self.quotas])
        quota = np.asarray(self.quotas, np.int64)[source]
        # (2k + 1) / (2q): both exact in float64 and the quotient correctly rounded, so equal times compare equal
        time = (2 * k + 1).astype(np.float64) / (2 * quota).astype(np.float64)
        at = np.lexsort((source, time))  # by time, ties to the source earlier in the Mix
        return source[at], k[at]

    def virtual_order(self, epoch: int, start: int = 0) -> np.ndarray:
        """``epoch``'s documents from position ``start`` on: virtual ids ``row + num_rows * pass`` (row = id % rows)."""
        if epoch < 0 or start < 0:
            raise ValueError(f"epoch and start must be >= 0, got epoch={epoch}, start={start}")
        source, k = self._schedule()
        out = np.empty(len(source), np.int64)
        offsets, rows = self.offsets, self.num_rows
        for s, (n, q) in enumerate(zip(self.sizes, self.quotas, strict=True)):
            if q == 0:
                continue
            at = source == s
            stream = epoch * q + k[at]  # this source's stream positions, in the epoch's order
            passes, positions = np.divmod(stream, n)
            drawn = positions.copy()
            if self.shuffle:
                for p in np.unique(passes).tolist():
                    mine = passes == p
                    drawn[mine] = Permutation(n, self._seed(s), p)(positions[mine])
            out[at] = offsets[s] + drawn + rows * passes
        return out[start:]

    def _seed(self, source: int) -> int:
        """Source ``source``'s own key, from the job's seed (a stream per source)."""
        return splitmix((int(self.seed) + GOLDEN * (source + 1)) & _MASK64)

    def dataset_of(self, rows: np.ndarray) -> np.ndarray:
        """The source (position in the Mix) of each of the Mix's ``rows``; -1 where a row is negative (padding)."""
        rows = np.asarray(rows, np.int64)
        source = np.searchsorted(self.offsets[1:], rows, side="right")
        return np.where(rows >= 0, source, -1)


@dataclass(frozen=True)
class MixSamples:
    """A Mix's documents dealt to ranks one at a time (padded batches), as the sampler deals samples.

    Rank ``r`` of ``W`` takes positions ``r, r + W, ...`` of each epoch's :class:`MixOrder`; without ``drop_last`` the
    ranks are padded to the same count with documents from the epoch's start (``DistributedSampler``'s rule), with it
    the last ``epoch_size % W`` are not read that epoch (:mod:`.sampler`'s "Splits" for an elastic resume).
    """

    documents: MixOrder
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size): rank={self.rank}, world_size={self.world_size}")
        if self.drop_last and self.documents.epoch_size < self.world_size:
            raise ValueError(f"drop_last with {self.documents.epoch_size} samples an epoch over world_size="
                             f"{self.world_size} leaves ranks empty")

    @property
    def num_rows(self) -> int:
        """The Mix's rows."""
        return self.documents.num_rows

    def total(self, epoch: int = 0) -> int:
        """Samples per epoch over all ranks before padding or truncation."""
        return self.documents.epoch_size

    def length(self, start: int, world_size: int | None = None, epoch: int = 0) -> int:
        """Samples this rank gets from an epoch split from global position ``start`` on."""
        ranks = self.world_size if world_size is None else world_size
        left = max(0, self.documents.epoch_size - start)
        return left // ranks if self.drop_last else -(-left // ranks)

    def virtual_order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's documents of ``epoch`` (virtual ids, :meth:`MixOrder.virtual_order`)."""
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        positions = np.arange(self.length(start), dtype=np.int64) * self.world_size + start + self.rank
        return self.documents.virtual_order(epoch)[positions % self.documents.epoch_size]

    def rows(self, virtual: np.ndarray) -> np.ndarray:
        """The Mix's rows of virtual ids."""
        return virtual % self.num_rows

    def planned_for(self, world_size: int | None) -> MixSamples:
        """Itself: the order does not depend on the world size."""
        return self
