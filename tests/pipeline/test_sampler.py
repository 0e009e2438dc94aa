from collections import Counter

import numpy as np
import pytest

from stallfree.pipeline.sampler import Sampler


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_across_ranks(world_size: int, drop_last: bool) -> None:
    n = 37  # prime: never divides by the world size
    counts: Counter[int] = Counter()
    lengths = set()
    for rank in range(world_size):
        order = Sampler(n, rank=rank, world_size=world_size, seed=5, drop_last=drop_last).virtual_order(epoch=2)
        lengths.add(len(order))
        counts.update(order.tolist())
    assert len(lengths) == 1, "every rank gets the same count"
    if drop_last:
        assert all(c == 1 for c in counts.values())
        assert len(counts) == n - n % world_size
    else:
        assert set(counts) == set(range(n))
        pad = -n % world_size
        assert sum(counts.values()) == n + pad
        assert sum(c - 1 for c in counts.values()) == pad


def test_permutation_depends_on_seed_and_epoch_only() -> None:
    a = Sampler(50, seed=1).virtual_order(0)
    assert np.array_equal(a, Sampler(50, seed=1).virtual_order(0))
    assert not np.array_equal(a, Sampler(50, seed=1).virtual_order(1))
    assert not np.array_equal(a, Sampler(50, seed=2).virtual_order(0))
    assert sorted(a.tolist()) == list(range(50))


def test_no_shuffle_keeps_row_order() -> None:
    assert Sampler(10, shuffle=False, rank=1, world_size=3).virtual_order(4).tolist() == [1, 4, 7, 0]


def test_example_echo_repeats_each_row_k_times_with_distinct_keys() -> None:
    s = Sampler(11, echo=3, seed=0)
    order = s.virtual_order(0)
    assert len(set(order.tolist())) == 33
    assert Counter(s.rows(order).tolist()) == {row: 3 for row in range(11)}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_rows": 0}, "empty"),
        ({"num_rows": 5, "rank": 2, "world_size": 2}, "rank must be in"),
        ({"num_rows": 5, "echo": 0}, "echo must be"),
        ({"num_rows": 3, "world_size": 4, "drop_last": True}, "leaves ranks empty"),
    ],
)
def test_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Sampler(**kwargs)
