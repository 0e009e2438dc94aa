"""Order properties over many shapes (hypothesis): exactly once per epoch, equal counts per rank, reproducible.

The sampler is checked over wide ranges of dataset size, world size, drop_last, echo and seed; the Loader,
whose batching and padding sit on top of it, over a narrower range (each example builds a DALI graph).
"""

from collections import Counter
from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stallfree import DatasetReader, Loader
from stallfree.pipeline.sampler import Sampler
from stallfree.transforms import CenterCrop, Normalize

shapes = st.fixed_dictionaries({
    "num_rows": st.integers(1, 300),
    "world_size": st.integers(1, 9),
    "drop_last": st.booleans(),
    "echo": st.integers(1, 3),
    "seed": st.integers(0, 2**63 - 1),
    "shuffle": st.booleans(),
})


def _sampler(rank: int, shape: dict) -> Sampler:
    return Sampler(shape["num_rows"], rank, shape["world_size"], shape["shuffle"], shape["seed"],
                   shape["drop_last"], shape["echo"])


def _valid(shape: dict) -> bool:
    return not shape["drop_last"] or shape["num_rows"] * shape["echo"] >= shape["world_size"]


@settings(max_examples=300, deadline=None)
@given(shapes, st.integers(0, 5))
def test_sampler_delivers_every_virtual_sample_once_per_epoch(shape: dict, epoch: int) -> None:
    if not _valid(shape):
        return
    world, n = shape["world_size"], shape["num_rows"] * shape["echo"]
    orders = [_sampler(r, shape).virtual_order(epoch) for r in range(world)]
    assert len({len(o) for o in orders}) == 1, "every rank gets as many samples"
    seen = Counter(np.concatenate(orders).tolist())
    if shape["drop_last"]:
        assert all(c == 1 for c in seen.values()) and len(seen) == n // world * world
    else:
        assert set(seen) == set(range(n)), "nothing is left out"
        assert sum(seen.values()) == n + (-n % world), "only the padding repeats"
        assert sum(c - 1 for c in seen.values()) == -n % world


@settings(max_examples=150, deadline=None)
@given(shapes, st.integers(0, 5))
def test_sampler_order_is_a_function_of_seed_and_epoch(shape: dict, epoch: int) -> None:
    if not _valid(shape):
        return
    for rank in range(shape["world_size"]):
        first = _sampler(rank, shape).virtual_order(epoch)
        again = _sampler(rank, shape).virtual_order(epoch)
        np.testing.assert_array_equal(first, again)
        rows = _sampler(rank, shape).rows(first)
        assert rows.min() >= 0 and rows.max() < shape["num_rows"]


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 200), st.integers(1, 6), st.integers(0, 2**32), st.integers(1, 3))
def test_echoed_rows_appear_exactly_echo_times(num_rows: int, world: int, seed: int, echo: int) -> None:
    orders = [Sampler(num_rows, r, world, True, seed, False, echo).virtual_order(0) for r in range(world)]
    virtual = np.concatenate(orders)[: num_rows * echo]  # the padding sits at each rank's end; count the rest
    per_row = Counter((np.unique(np.concatenate(orders)) % num_rows).tolist())
    assert len(virtual) == num_rows * echo
    assert all(c == echo for c in per_row.values()) and len(per_row) == num_rows


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 7), st.integers(1, 3), st.booleans(), st.integers(0, 1000))
def test_loader_batches_cover_each_sample_once_on_equal_ranks(indexed_reader: Callable[[int], DatasetReader], n: int,
                                                               batch: int, world: int, drop_last: bool,
                                                               seed: int) -> None:
    if drop_last and n // world < batch:
        return  # no full batch for a rank: the Loader refuses this at construction (tested elsewhere)
    reader = indexed_reader(n)
    per_rank: list[list[int]] = []
    for rank in range(world):
        loader = Loader(reader, batch, transform=[CenterCrop(4), Normalize()], seed=seed, drop_last=drop_last,
                        rank=rank, world_size=world, num_threads=1)
        labels = [lab.tolist() for _, lab in loader]
        assert len(labels) == len(loader)
        assert all(len(b) == batch for b in (labels if drop_last else labels[:-1]))
        per_rank.append([x for b in labels for x in b])
    assert len({len(r) for r in per_rank}) == 1, "every rank delivers as many samples"
    seen = Counter(x for r in per_rank for x in r)
    if drop_last:
        assert all(c == 1 for c in seen.values()) and len(seen) == (n // world) // batch * batch * world
    else:
        assert set(seen) == set(range(n)) and sum(seen.values()) == n + (-n % world)
