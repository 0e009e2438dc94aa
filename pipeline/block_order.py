"""The shard-block shuffle: a permutation per ``(seed, epoch)`` whose every stretch lies in a few shards.

A global permutation touches every shard within a few rows, so a cache smaller than the dataset downloads each
shard many times per epoch. The block shuffle (in the spirit of MosaicML Streaming's ``py1b``) draws, from
``(seed, epoch)``::

    1. a permutation of the shards              shards   5 2 7 0 | 3 6 1 4      (block_shards = 4)
    2. cut into blocks of block_shards shards   block 0 = rows of shards 5 2 7 0, block 1 = 3 6 1 4
    3. a permutation of the rows in each block  block 0 = its rows in random order, then block 1's ...

Guarantees: every virtual sample exactly once per epoch (it is a permutation, so the sampler's split over ranks
keeps exactly-once and its padding rules); the same order for the same ``(seed, epoch, shards, block_shards)``,
so resume is bit-identical; a rank reading its share (every ``world_size``-th position) is inside one block at a
time, so its working set is ``block_shards`` shards (the read-ahead adds the next block's). What it gives up:
two samples in different blocks never swap places within the epoch, so the order is less random than the global
one; a block of more shards (or several epochs) brings it closer. With example echo ``k`` each repeat of the
dataset is ``k`` more virtual shards, shuffled with the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from stallfree.pipeline.reader_base import Reader

__all__ = ["BlockOrder", "block_order"]


class BlockOrder:
    """``BlockOrder(rows_per_shard, block_shards, seed, echo)(epoch)``: the epoch's block-shuffled virtual ids.

    Raises:
        ValueError: ``block_shards`` is not a positive int, or the shards hold no rows.
    """

    def __init__(self, rows_per_shard: Sequence[int], block_shards: int, seed: int, echo: int = 1):
        if not isinstance(block_shards, int) or isinstance(block_shards, bool) or block_shards < 1:
            raise ValueError(f"block_shards must be an int >= 1 (shards per shuffle block), got {block_shards!r}")
        self.rows = np.asarray(rows_per_shard, np.int64)
        if self.rows.sum() <= 0:
            raise ValueError("the block shuffle needs shards with rows; these shards are empty")
        self.block_shards, self.seed, self.echo = block_shards, seed, echo
        self.starts = np.concatenate([[0], np.cumsum(self.rows)])

    def __call__(self, epoch: int) -> np.ndarray:
        n, count = int(self.starts[-1]), len(self.rows)
        # a stream of its own, so that a block order never equals the global order of the same (seed, epoch)
        rng = np.random.Generator(np.random.Philox(key=[self.seed & 0xFFFFFFFFFFFFFFFF, epoch], counter=[0, 0, 0, 1]))
        shards = rng.permutation(count * self.echo)  # virtual shard s: shard s % count of repeat s // count
        pieces = []
        for first in range(0, len(shards), self.block_shards):
            block = shards[first : first + self.block_shards]
            ids = np.concatenate([np.arange(self.starts[s % count], self.starts[s % count + 1]) + (s // count) * n
                                  for s in block])
            pieces.append(rng.permutation(ids))
        return np.concatenate(pieces).astype(np.int64)


def block_order(reader: Reader, block_shards: int, seed: int, echo: int) -> BlockOrder:
    """The block shuffle of a sharded source (``shard_rows()`` not None), or a ValueError saying which have shards."""
    shard_rows = reader.shard_rows()
    if shard_rows is None:
        raise ValueError(f"shuffle='block' shuffles the shards of ingested data, but the source is a "
                         f"{reader.kind}; ingest it (`stallfree ingest`) or use shuffle=True")
    return BlockOrder(list(shard_rows), block_shards, seed, echo)
