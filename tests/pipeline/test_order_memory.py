"""The order at 100M-sample scale: a rank's share without an epoch-sized array, and the same values as before.

The pinned digests were taken from the order as stallfree drew it before the per-block evaluation (the whole
permutation materialised, then indexed); a change to either draw changes them, and resumed jobs with them.
"""

import hashlib
import tracemalloc

import numpy as np
import pytest

from stallfree.pipeline.block_order import BlockOrder
from stallfree.pipeline.permutation import Permutation
from stallfree.pipeline.sampler import Sampler


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, np.int64).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(("n", "seed", "epoch", "digest"), [
    (1, 0, 0, "af5570f5a1810b7a"),
    (10, 0, 3, "9ae538f93b3497a6"),
    (1025, 123, 0, "9e6b6420250b6bdf"),  # 2**11 values for 1,025: about half of them cycle-walk
    (100_003, 2**63 + 5, 9, "dff65612b4dbc164"),  # several blocks of 32k
    (1 << 20, 1, 1, "36a4e5a7ee01d0bb"),
])
def test_the_permutation_is_the_one_resumed_jobs_hold(n: int, seed: int, epoch: int, digest: str) -> None:
    assert _digest(Permutation(n, seed, epoch)(np.arange(n))) == digest


@pytest.mark.parametrize(("block_shards", "seed", "echo", "epoch", "digest"), [
    (1, 0, 1, 0, "b91044a58c39c749"),
    (2, 3, 1, 1, "6c2088c3b12f77bf"),
    (3, 9, 2, 2, "005826178917cfaf"),
    (10, 1, 3, 0, "00ec897afa7690aa"),
])
def test_the_block_order_is_the_one_resumed_jobs_hold(block_shards: int, seed: int, echo: int, epoch: int,
                                                      digest: str) -> None:
    assert _digest(BlockOrder([7, 0, 5, 9, 3, 11, 4], block_shards, seed, echo)(epoch)) == digest


@pytest.mark.parametrize(("keywords", "digests"), [
    ({"num_rows": 1000, "rank": 1, "world_size": 3, "seed": 4}, ("10793d6c9c8e6654", "56bce63ac88af940")),
    ({"num_rows": 1001, "rank": 2, "world_size": 4, "seed": 4, "echo": 2, "drop_last": True},
     ("263c2eaf9a441201", "96c14ba0326cb5e5")),
])
def test_a_ranks_order_is_the_one_resumed_jobs_hold(keywords: dict, digests: tuple[str, str]) -> None:
    sampler = Sampler(**keywords)
    assert (_digest(sampler.virtual_order(1)), _digest(sampler.virtual_order(2, start=37))) == digests


@pytest.mark.parametrize("echo", [1, 3])
@pytest.mark.parametrize("block_shards", [1, 4, 100])
def test_a_block_order_at_positions_is_the_whole_order_there(echo: int, block_shards: int) -> None:
    rng = np.random.default_rng(0)
    order = BlockOrder(list(rng.integers(0, 50, 40)), block_shards, 11, echo)
    whole = order(5)
    for positions in (np.arange(len(whole)), np.arange(3, len(whole), 7), rng.permutation(len(whole))[:300],
                      np.array([len(whole) - 1, 0, 0, 17]), np.array([], np.int64),
                      np.concatenate([np.arange(5, len(whole), 4), [1, 5]])):  # a rank's share, padding wrapped
        assert np.array_equal(order.at(5, positions), whole[positions])


def test_a_block_order_refuses_positions_outside_the_epoch() -> None:
    with pytest.raises(ValueError, match=r"range\(20\)"):
        BlockOrder([10, 10], 1, 0, 1).at(0, np.array([0, 20]))


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_a_ranks_share_of_the_epoch_is_the_same_drawn_either_way(shuffle: str) -> None:
    rows = [1000] * 60
    permute = BlockOrder(rows, 8, 3, 1) if shuffle == "block" else None
    whole = Sampler(60_000, seed=3, permute=permute).virtual_order(2)
    for rank in range(7):  # 60,000 over 7 ranks: padded, the last positions wrap to the start
        share = Sampler(60_000, rank=rank, world_size=7, seed=3, permute=permute).virtual_order(2)
        assert np.array_equal(share, whole[(rank + 7 * np.arange(len(share))) % 60_000])


def _peak(call: object) -> int:
    tracemalloc.start()
    try:
        call()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_permutation_overwrites_the_positions_it_is_given() -> None:
    n = (1 << 22) + 1  # 2**23 values for 4.2M: about half of them cycle-walk
    positions = np.arange(n, dtype=np.int64)  # 33.6 MB
    expected = Permutation(n, 1, 2)(positions)
    given = positions.copy()
    peak = _peak(lambda: Permutation(n, 1, 2)(given, overwrite=True))
    assert np.array_equal(given, expected)
    assert peak < positions.nbytes / 4, f"a copy of the positions was made ({peak} bytes at the peak)"
    assert np.array_equal(positions, np.arange(n)), "without overwrite the input is left as it was"


def test_a_ranks_block_order_holds_no_epoch_sized_array() -> None:
    rows = [2048] * 1000  # 2,048,000 rows: 16 MB of int64 for the epoch
    sampler = Sampler(len(rows) * 2048, rank=3, world_size=8, seed=1, permute=BlockOrder(rows, 4, 1, 1))
    share = 2_048_000 // 8 * 8  # bytes of the rank's order (256,000 int64)
    peak = _peak(lambda: sampler.virtual_order(0))
    assert peak < 2 * share, f"{peak} bytes at the peak for {share} of ids; the epoch's order is {2_048_000 * 8}"
