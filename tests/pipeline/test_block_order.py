"""The shard-block shuffle: exactly once across ranks, keyed by (seed, epoch), and a bounded working set."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree.pipeline.block_order import BlockOrder
from stallfree.pipeline.sampler import Sampler

layouts = st.fixed_dictionaries({
    "shard_rows": st.lists(st.integers(1, 40), min_size=1, max_size=30),
    "block_shards": st.integers(1, 6),
    "world_size": st.integers(1, 8),
    "drop_last": st.booleans(),
    "echo": st.integers(1, 3),
    "seed": st.integers(0, 2**63 - 1),
})


def _samplers(layout: dict) -> list[Sampler]:
    order = BlockOrder(layout["shard_rows"], layout["block_shards"], layout["seed"], layout["echo"])
    n = sum(layout["shard_rows"])
    return [Sampler(n, r, layout["world_size"], True, layout["seed"], layout["drop_last"], layout["echo"],
                    permute=order) for r in range(layout["world_size"])]


@settings(max_examples=200, deadline=None)
@given(layouts, st.integers(0, 4))
def test_every_virtual_sample_once_per_epoch_across_ranks(layout: dict, epoch: int) -> None:
    n, world = sum(layout["shard_rows"]) * layout["echo"], layout["world_size"]
    if layout["drop_last"] and n < world:
        return
    orders = [s.virtual_order(epoch) for s in _samplers(layout)]
    assert len({len(o) for o in orders}) == 1
    seen = Counter(np.concatenate(orders).tolist())
    if layout["drop_last"]:
        assert all(c == 1 for c in seen.values()) and len(seen) == n // world * world
    else:
        assert set(seen) == set(range(n)) and sum(seen.values()) == n + (-n % world)


@settings(max_examples=100, deadline=None)
@given(layouts, st.integers(0, 4))
def test_each_block_reads_only_its_shards(layout: dict, epoch: int) -> None:
    rows, block = np.asarray(layout["shard_rows"]), layout["block_shards"]
    order = BlockOrder(rows, block, layout["seed"], layout["echo"])(epoch)
    starts = np.concatenate([[0], np.cumsum(rows)])
    shard = np.searchsorted(starts, order % starts[-1], side="right") - 1 + (order // starts[-1]) * len(rows)
    sizes = rows[shard % len(rows)]
    touched: set[int] = set()
    missing = 0  # rows of the touched shards not read yet
    for position in range(len(order)):  # cut the order where its prefix holds whole shards only
        if int(shard[position]) not in touched:
            touched.add(int(shard[position]))
            missing += int(sizes[position])
        missing -= 1
        assert len(touched) <= block, f"rows of {len(touched)} shards interleave, more than a block's {block}"
        if missing == 0:
            touched = set()


def test_the_order_depends_on_seed_and_epoch_only() -> None:
    make = lambda seed: BlockOrder([5, 7, 3, 9, 4], 2, seed)  # noqa: E731
    assert np.array_equal(make(1)(0), make(1)(0))
    assert not np.array_equal(make(1)(0), make(1)(1)) and not np.array_equal(make(1)(0), make(2)(0))
    global_order = np.random.Generator(np.random.Philox(key=[1, 0])).permutation(28)
    assert not np.array_equal(make(1)(0), global_order)


def test_a_rank_stays_inside_the_current_block() -> None:
    rows = [10] * 12
    sampler = [Sampler(120, r, 3, True, 7, permute=BlockOrder(rows, 2, 7)) for r in range(3)]
    for s in sampler:  # 20 rows per block over 3 ranks: each rank's first 6 reads lie in its first 2 shards
        shards = {int(v) // 10 for v in s.virtual_order(0)[:6]}
        assert len(shards) <= 2


@pytest.mark.parametrize("block_shards", [0, -1, 1.5, True])
def test_bad_block_sizes_are_refused(block_shards: object) -> None:
    with pytest.raises(ValueError, match="block_shards must be an int >= 1"):
        BlockOrder([3, 3], block_shards, 0)  # type: ignore[arg-type]
