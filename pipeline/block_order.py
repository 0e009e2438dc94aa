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

_RUNS = 64  # ascending runs of positions looked up as they are; more, and they are sorted first


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
        """The whole epoch's order (``echo`` times the rows); :meth:`at` gives a rank's part of it."""
        return self.at(epoch, np.arange(int(self.starts[-1]) * self.echo, dtype=np.int64), overwrite=True)

    def at(self, epoch: int, positions: np.ndarray, *, overwrite: bool = False) -> np.ndarray:
        """The epoch's order at ``positions`` (int64, any order): ``self(epoch)[positions]`` without the epoch.

        The blocks are drawn one after the other from the one stream, as the whole order draws them, and only the
        values at ``positions`` are kept: a rank holds its share and one block, not the epoch (800 MB of int64 at
        100M rows). Blocks after the last position asked are not drawn. ``overwrite`` gives the values in the
        memory of ``positions`` when it is a C-contiguous int64 array (the sampler's own positions).

        A rank's positions ascend but for the padding's wrap to the start: each ascending run is looked up in
        place; positions in no such order (more than :data:`_RUNS` runs) are sorted first.
        """
        n, count = int(self.starts[-1]), len(self.rows)
        given = np.asarray(positions)
        if given.size and (given.min() < 0 or given.max() >= n * self.echo):
            raise ValueError(f"positions must lie in range({n * self.echo}), got [{given.min()}, {given.max()}]")
        in_place = overwrite and given.dtype == np.int64 and given.flags.c_contiguous
        out = given if in_place else np.array(given, np.int64)
        flat = out.reshape(-1)  # a view
        # a stream of its own, so that a block order never equals the global order of the same (seed, epoch)
        rng = np.random.Generator(np.random.Philox(key=[self.seed & 0xFFFFFFFFFFFFFFFF, epoch], counter=[0, 0, 0, 1]))
        shards = rng.permutation(count * self.echo)  # virtual shard s: shard s % count of repeat s // count
        firsts = np.arange(0, len(shards), self.block_shards)
        offsets = np.concatenate([[0], np.cumsum(np.add.reduceat(self.rows[shards % count], firsts))])
        breaks = np.flatnonzero(flat[1:] < flat[:-1]) + 1
        order = None if len(breaks) < _RUNS else np.argsort(flat, kind="stable")
        runs = [flat[a:b] for a, b in zip([0, *breaks], [*breaks, len(flat)], strict=True)] if order is None \
            else [flat[order]]
        bounds = [np.searchsorted(run, offsets) for run in runs]  # before any run is overwritten
        last = max((int(run[-1]) for run in runs if run.size), default=-1)
        for b, first in enumerate(firsts):
            if offsets[b] > last:
                break
            block = shards[first : first + self.block_shards]
            ids = np.concatenate([np.arange(self.starts[s % count], self.starts[s % count + 1]) + (s // count) * n
                                  for s in block])
            drawn = rng.permutation(ids)  # drawn for every block up to the last asked: the stream's next draws
            for run, bound in zip(runs, bounds, strict=True):
                lo, hi = bound[b], bound[b + 1]
                if hi > lo:
                    run[lo:hi] = drawn[run[lo:hi] - offsets[b]]
        if order is not None:
            flat[order] = runs[0]
        return out


def block_order(reader: Reader, block_shards: int, seed: int, echo: int) -> BlockOrder:
    """The block shuffle of a sharded source (``shard_rows()`` not None), or a ValueError saying which have shards."""
    shard_rows = reader.shard_rows()
    if shard_rows is None:
        raise ValueError(f"shuffle='block' shuffles the shards of ingested data, but the source is a "
                         f"{reader.kind}; ingest it (`stallfree ingest`) or use shuffle=True")
    return BlockOrder(list(shard_rows), block_shards, seed, echo)
