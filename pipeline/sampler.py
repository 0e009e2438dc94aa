"""The sampler: which samples a rank reads, in which order, each epoch.

Order is a true global permutation of the whole (echoed) dataset, drawn from ``(seed, epoch)``, then split over
ranks as ``torch.utils.data.DistributedSampler`` splits it::

    positions  0 1 2 3 4 5 6 7 8 9 | 0 1      (n = 10, world_size = 4: padded to 12 from the start)
    rank 0     0       4       8            drop_last=True instead truncates to 8:
    rank 1       1       5       9          every rank gets n // world_size rows,
    rank 2         2       6       0        the last n % world_size rows of the
    rank 3           3       7       1      permutation go unread that epoch.

With ``echo=k`` (example-level data echoing, Choi et al. 2019) the permutation runs over ``k * n`` virtual
samples; virtual sample ``v`` reads row ``v % n`` and is augmented under its own key ``v``, so each repeat gets
fresh augmentation and the shuffle spreads the repeats apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Sampler"]


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
    """

    num_rows: int
    rank: int = 0
    world_size: int = 1
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    echo: int = 1

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
        if self.drop_last:
            return self.num_virtual // self.world_size
        return math.ceil(self.num_virtual / self.world_size)

    def virtual_order(self, epoch: int) -> np.ndarray:
        """This rank's virtual sample ids for ``epoch`` (int64); row of virtual id ``v`` is ``v % num_rows``."""
        n = self.num_virtual
        if self.shuffle:
            order = np.random.Generator(np.random.Philox(key=[self.seed & 0xFFFFFFFFFFFFFFFF, epoch])).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        total = len(self) * self.world_size
        if total > n:  # pad from the start, repeating if the padding is longer than the data (DistributedSampler)
            order = np.concatenate([order, np.resize(order, total - n)])
        return order[self.rank : total : self.world_size].astype(np.int64)

    def rows(self, virtual: np.ndarray) -> np.ndarray:
        """The dataset rows of virtual sample ids."""
        return virtual % self.num_rows
