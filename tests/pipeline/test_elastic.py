"""Elastic resume (issue 16): a state from 4 ranks mid-epoch, finished on 2 and on 3 ranks, each sample once."""

import json
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

from stallfree import DatasetReader, Loader
from stallfree.pipeline.elastic import elastic_split
from stallfree.pipeline.sampler import Sampler
from stallfree.transforms import CenterCrop, Normalize

N, BATCH = 53, 3  # prime: divides by no world size


@pytest.fixture
def reader(indexed_reader: Callable[[int], DatasetReader]) -> DatasetReader:
    return indexed_reader(N)


def make(reader: DatasetReader, rank: int, world: int, **kwargs) -> Loader:
    return Loader(reader, BATCH, transform=[CenterCrop(4), Normalize()], seed=11,
                  rank=rank, world_size=world, num_threads=1, **kwargs)


def run_ranks(reader: DatasetReader, world: int, batches: int | None, state: dict | None = None,
              **kwargs) -> tuple[list[int], list[dict]]:
    """Labels every rank delivers (``batches`` each, or to the epoch's end), and each rank's state after them."""
    seen, states = [], []
    for rank in range(world):
        loader = make(reader, rank, world, **kwargs)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        for number, (_, labels) in enumerate(it):
            seen += labels.tolist()
            if batches is not None and number + 1 == batches:
                break
        states.append(json.loads(json.dumps(loader.state_dict())))
    return seen, states


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_state_from_4_ranks_finishes_the_epoch_on_another_world_size(reader: DatasetReader, world: int,
                                                                        drop_last: bool) -> None:
    before, states = run_ranks(reader, 4, 2, drop_last=drop_last)
    assert len({(s["batcher"]["position"], s["sampler"]["split"]) for s in states}) == 1, (
        "synchronous ranks stand at the same place")
    after, ends = run_ranks(reader, world, None, states[0], drop_last=drop_last)
    remaining = Counter(after)
    if drop_last:
        assert all(c == 1 for c in remaining.values()), "nothing is delivered twice"
        assert not set(before) & set(remaining), "nothing delivered before comes again"
        left = N - len(before)
        assert len(after) == (left // world) // BATCH * BATCH * world, "full batches only, the same on every rank"
    else:
        assert set(before) | set(remaining) == set(range(N)), "every sample of the epoch is delivered"
        fresh = [x for x in after if x not in set(before)]
        assert Counter(fresh) == Counter(set(fresh)), "each remaining sample exactly once"
        assert set(fresh) == set(range(N)) - set(before)
        left = N - len(before)
        assert len(after) == left + (-left % world), "only the padding repeats"
    assert all(s["epoch"] == 1 and s["batcher"]["position"] == 0 for s in ends), "the epoch ended: the next one is next"


def test_an_elastic_resume_can_be_resumed_elastically_again(reader: DatasetReader) -> None:
    before, states = run_ranks(reader, 4, 1)
    middle, states3 = run_ranks(reader, 3, 2, states[0])
    after, _ = run_ranks(reader, 2, None, states3[1])
    delivered = before + middle + after
    assert set(delivered) == set(range(N))
    assert len(delivered) - N == len(delivered) - len(set(delivered)) <= 2, "only the last split pads"


def test_the_next_epoch_after_an_elastic_pass_is_a_whole_epoch(reader: DatasetReader) -> None:
    _, states = run_ranks(reader, 4, 2)
    seen = []
    for rank in range(3):
        loader = make(reader, rank, 3)
        loader.load_state_dict(states[0])
        list(loader)
        assert loader.epoch == 1, "the elastic pass ended its epoch"
        seen += [x for _, labels in loader for x in labels.tolist()]
    assert set(seen) == set(range(N)) and len(seen) == N + (-N % 3)


def test_the_split_is_what_the_sampler_skips() -> None:
    """The ranks of W together read a prefix of the global positions: W' continue right after it."""
    order = Sampler(N, 0, 1, seed=4).virtual_order(0)
    parts = [Sampler(N, r, 4, seed=4).virtual_order(0)[:6] for r in range(4)]
    assert sorted(np.concatenate(parts).tolist()) == sorted(order[:24].tolist())
    rest = [Sampler(N, r, 3, seed=4).virtual_order(0, start=24) for r in range(3)]
    dealt = np.concatenate(rest).tolist()  # 29 left over 3 ranks: one padding position, 53 % 53 = global 0
    assert sorted(dealt) == sorted(order[24:].tolist() + [int(order[0])])


def test_a_state_with_skipped_samples_is_refused_on_another_world_size() -> None:
    state = {"batcher": {"position": 6, "repeat": 0, "batches": 1}, "sampler": {"split": 0},
             "fingerprint": {"world_size": 4},
             "skipped": [{"index": 3, "source": "x", "reason": "truncated", "epoch": 0, "position": 2}]}
    with pytest.raises(ValueError, match=r"lists 1 skipped sample\(s\).*resume on 4 ranks"):
        elastic_split(state, 2)


def test_a_state_between_repeats_of_an_echoed_batch_is_refused_on_another_world_size(reader: DatasetReader) -> None:
    loader = make(reader, 0, 4, echo=2, echo_mode="batch")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    # Before elastic resume it said: Loader state has rank=0 ... (any other world size was refused)
    with pytest.raises(ValueError, match=r"after repeat 1 of an echoed batch"):
        make(reader, 0, 2, echo=2, echo_mode="batch").load_state_dict(state)
