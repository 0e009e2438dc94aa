"""``loader.sampler.set_epoch(epoch)``, as Lightning's fit loop calls it on a DataLoader's DistributedSampler.

It is ``loader.set_epoch``: calling it every epoch changes nothing, and after ``load_state_dict`` setting the
state's epoch (what Lightning does on resume) keeps the state's position, so the resumed run is bit-identical.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch

from stallfree import Loader
from stallfree.pipeline.loader_sampler import LoaderSampler
from stallfree.pipeline.sampler import Sampler
from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop


def make(source: Path) -> Loader:
    return Loader(source, batch_size=8, transform=[RandomResizedCrop(8), RandomHorizontalFlip(), Normalize()],
                  num_threads=1, seed=4, shuffle=True, columns=["index"])


def batches(loader: Loader) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return [(images, labels, extra["index"]) for images, labels, extra in loader]


def same(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> bool:
    if len(a) != len(b):
        return False
    return all(torch.equal(x, y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))


def test_it_is_the_loaders_set_epoch(indexed_list: Path) -> None:
    by_sampler, by_loader = make(indexed_list), make(indexed_list)
    assert isinstance(by_sampler.sampler, Sampler) and len(by_sampler.sampler) == 37
    by_sampler.sampler.set_epoch(3)
    by_loader.set_epoch(3)
    assert by_sampler.epoch == by_sampler.sampler.epoch == 3
    assert same(batches(by_sampler), batches(by_loader))
    with pytest.raises(ValueError, match="epoch must be an int >= 0, got -1"):
        by_sampler.sampler.set_epoch(-1)


def test_a_fit_loop_that_sets_each_epoch_sees_the_loaders_own_epochs(indexed_list: Path) -> None:
    driven, alone = make(indexed_list), make(indexed_list)
    seen = []
    for epoch in range(2):
        driven.sampler.set_epoch(epoch)
        run = batches(driven)
        assert same(run, batches(alone))  # the Loader advances by itself; set_epoch agrees with it
        seen.append(torch.cat([index for _, _, index in run]).tolist())
    assert sorted(seen[0]) == sorted(seen[1]) == list(range(37)) and seen[0] != seen[1]


def test_resume_after_set_epoch_is_bit_identical(indexed_list: Path) -> None:
    reference = make(indexed_list)
    reference.sampler.set_epoch(1)
    whole = batches(reference)
    interrupted = make(indexed_list)
    interrupted.sampler.set_epoch(1)
    stream = iter(interrupted)
    head = [next(stream) for _ in range(2)]
    state = interrupted.state_dict()
    del stream
    resumed = make(indexed_list)
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)  # Lightning sets the restored epoch before iterating
    rest = batches(resumed)
    assert same([(i, label, e["index"]) for i, label, e in head] + rest, whole)


def test_it_ends_a_pass_in_progress(indexed_list: Path) -> None:
    loader = make(indexed_list)
    stream = iter(loader)
    next(stream)
    loader.sampler.set_epoch(5)
    with pytest.raises(RuntimeError, match="set_epoch"):
        next(stream)
    assert loader.epoch == 5


class Owner:
    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def test_a_sampler_whose_loader_is_gone_says_so() -> None:
    owner = Owner()
    sampler = LoaderSampler(10, owner=weakref.ref(owner))
    sampler.set_epoch(2)
    assert owner.epoch == sampler.epoch == 2
    del owner  # the sampler holds it weakly
    with pytest.raises(RuntimeError, match="Loader no longer exists"):
        sampler.set_epoch(0)
