"""The sampler: which samples a rank reads, in which order, each epoch.

Order is a true global permutation of the whole (echoed) dataset, keyed by ``(seed, epoch)``, then split over
ranks as ``torch.utils.data.DistributedSampler`` splits it::

    positions  0 1 2 3 4 5 6 7 8 9 | 0 1      (n = 10, world_size = 4: padded to 12 from the start)
    rank 0     0       4       8            drop_last=True instead truncates to 8:
    rank 1       1       5       9          every rank gets n // world_size rows,
    rank 2         2       6       0        the last n % world_size rows of the
    rank 3           3       7       1      permutation go unread that epoch.

With ``echo=k`` (example-level data echoing, Choi et al. 2019) the permutation runs over ``k * n`` virtual
samples; virtual sample ``v`` reads row ``v % n`` and is augmented under its own key ``v``, so each repeat gets
fresh augmentation and the shuffle spreads the repeats apart.

The permutation is a keyed bijection (:class:`~stallfree.pipeline.permutation.Permutation`) that each rank
evaluates at its own positions only, so no rank materialises the whole of it: 1/world_size of the work and memory
of drawing ``np.random.permutation(n)``.

**Splits** (elastic resume). An epoch's split over ranks may start at a global position ``start > 0``: the
positions before it were delivered already, by a job of another world size, and the positions from ``start`` on
are split over this job's ranks by the same rule, padded or truncated by ``drop_last`` as a fresh epoch is::

    world_size 4, 2 batches of 2 delivered:  global positions 0..15 read, every rank at its position 4
    resumed on world_size 3 at start=16:      rank r reads 16 + r, 19 + r, 22 + r, ...

Padding reads global position ``p % num_virtual``, samples from the start of the permutation, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from stallfree.pipeline.block_order import BlockOrder
from stallfree.pipeline.permutation import Permutation

__all__ = ["Order", "Sampler"]


class Order(Protocol):
    """What a run reads of an order: the ids a rank takes each epoch, their rows, and how many.

    A :class:`Sampler` deals samples; a :class:`~stallfree.pipeline.packing.PackOrder` deals packs of documents.
    """

    @property
    def rank(self) -> int:
        """This process's rank."""
        ...

    @property
    def world_size(self) -> int:
        """The ranks the order is dealt over."""
        ...

    @property
    def num_rows(self) -> int:
        """Rows of the dataset."""
        ...

    def total(self, epoch: int = 0) -> int:
        """Ids of an epoch over all ranks before padding or truncation."""
        ...

    def length(self, start: int, world_size: int | None = None, epoch: int = 0) -> int:
        """Ids this rank gets from an epoch split from global position ``start`` on."""
        ...

    def virtual_order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's ids for ``epoch``."""
        ...

    def rows(self, virtual: np.ndarray) -> np.ndarray:
        """The dataset rows of sample ids."""
        ...

    def planned_for(self, world_size: int | None) -> Order:
        """This order as planned for ``world_size`` ranks (a balanced pack order's epoch after an elastic resume)."""
        ...


@dataclass(frozen=True)
class Sampler:
    """Order and sharding of ``num_rows`` rows.

    Args:
        num_rows: rows in the dataset.
        rank, world_size: this process's share.
        shuffle: a fresh permutation per ``(seed, epoch)``; ``False`` keeps row order (evaluation).
        seed: the permutation's seed, the same on every rank.
        drop_last: truncate so that every rank has ``num_virtual // world_size`` samples instead of padding.
        echo: example-level echo factor ``k >= 1``.
        permute: another permutation of the ``num_virtual`` virtual ids by epoch, used instead of the global one
            when ``shuffle`` is true (the block shuffle, :mod:`.block_order`); split over ranks the same way.
    """

    num_rows: int
    rank: int = 0
    world_size: int = 1
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    echo: int = 1
    permute: Callable[[int], np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.num_rows <= 0:
            raise ValueError(f"the dataset is empty (num_rows={self.num_rows})")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size): rank={self.rank}, world_size={self.world_size}")
        if self.echo < 1:
            raise ValueError(f"echo must be >= 1, got {self.echo}")
        if self.drop_last and self.num_virtual < self.world_size:
            raise ValueError(
                f"drop_last with {self.num_virtual} samples over world_size={self.world_size} leaves ranks empty"
            )

    @property
    def num_virtual(self) -> int:
        """Samples per epoch over all ranks before padding or truncation (rows times echo)."""
        return self.num_rows * self.echo

    def __len__(self) -> int:
        """Samples this rank gets per epoch (the same on every rank)."""
        return self.length(0)

    def total(self, epoch: int = 0) -> int:
        """Samples of an epoch over all ranks before padding or truncation (:attr:`num_virtual`, whatever the epoch)."""
        return self.num_virtual

    def length(self, start: int, world_size: int | None = None, epoch: int = 0) -> int:
        """Samples this rank gets from an epoch split from global position ``start`` on (0 for the whole epoch).

        ``world_size`` asks what each rank got when the split was dealt over that many ranks instead (a state from
        another world size, :mod:`.elastic`); ``epoch`` is read by orders whose length changes by epoch (packs).
        """
        ranks = self.world_size if world_size is None else world_size
        left = max(0, self.num_virtual - start)
        return left // ranks if self.drop_last else -(-left // ranks)

    def virtual_order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's virtual sample ids for ``epoch`` (int64); row of virtual id ``v`` is ``v % num_rows``.

        Args:
            epoch: the epoch whose permutation is read.
            start: the global position the epoch's split over ranks starts at (see "Splits" above).
        """
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        n = self.num_virtual
        # global positions of this rank; past n is padding, read from the start (DistributedSampler's rule)
        positions = np.arange(self.length(start), dtype=np.int64)  # built in place: one rank-sized array
        positions *= self.world_size
        positions += start + self.rank
        positions %= n
        if not self.shuffle:
            return positions
        if isinstance(self.permute, BlockOrder):  # the block shuffle, drawn a block at a time: no epoch-sized array
            return self.permute.at(epoch, positions, overwrite=True)
        if self.permute is not None:
            return self.permute(epoch)[positions].astype(np.int64)
        return Permutation(n, self.seed, epoch)(positions, overwrite=True)

    def rows(self, virtual: np.ndarray) -> np.ndarray:
        """The dataset rows of virtual sample ids."""
        return virtual % self.num_rows

    def planned_for(self, world_size: int | None) -> Sampler:
        """Itself: a sampler's order does not depend on the world size it is dealt over."""
        return self
