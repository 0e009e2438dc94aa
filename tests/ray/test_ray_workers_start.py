"""RayWorkers whose actors find no free CPUs say what they wait for and give up; Loaders share one RayWorkers.

Issue 44, items 9 and 10: a second ``RayWorkers`` on a cluster whose CPUs the first one's actors hold, and a worker
larger than any node, waited for ever without a word. Against the real two-node cluster of tests/ray/conftest.py
(3 CPUs: a head of 1, a node of 2).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from stallfree import Loader, RayWorkers
from stallfree.transforms import RandomHorizontalFlip, RandomResizedCrop

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

SPEC = [RandomResizedCrop(12, scale=(0.3, 1.0)), RandomHorizontalFlip()]


def make(source: Path, workers: RayWorkers | None = None, seed: int = 3) -> Loader:
    return Loader(source, 5, transform=SPEC, shuffle=True, seed=seed, dtype="uint8", num_threads=1, workers=workers)


def assert_same(ours: list[Any], theirs: list[Any]) -> None:
    assert len(ours) == len(theirs)
    for (images, labels), (their_images, their_labels) in zip(ours, theirs, strict=True):
        assert torch.equal(images, their_images) and torch.equal(labels, their_labels)


def test_loaders_given_one_ray_workers_share_its_actors(indexed_list: Path, workers_of: Any) -> None:
    """Six Loaders on one RayWorkers that takes every CPU: more Loaders than an actor keeps setups of (4), so the
    first's setup is dropped and built again; before, its next pass failed with a KeyError from the actor."""
    workers = workers_of(3)  # every CPU of the cluster: a RayWorkers of each Loader's own could not start
    loaders = [make(indexed_list, workers, seed=seed) for seed in range(6)]
    locals_ = [make(indexed_list, seed=seed) for seed in range(6)]
    expected = [list(local) for local in locals_]
    train, val = iter(loaders[0]), iter(loaders[1])  # a training and a validation pass, interleaved
    got_train, got_val = [], []
    for a, b in zip(train, val, strict=True):
        got_train.append(a)
        got_val.append(b)
    assert_same(got_train, expected[0])
    assert_same(got_val, expected[1])
    actors = list(workers.pool().actors)
    for loader, want in zip(loaders[2:], expected[2:], strict=True):
        assert_same(list(loader), want)
    assert_same(list(loaders[0]), list(locals_[0]))  # its second pass, as the local Loader's
    assert workers.pool().actors == actors  # the same three actors served all six


def test_a_second_ray_workers_without_free_cpus_says_what_it_waits_for_then_fails(
    indexed_list: Path, workers_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: the first RayWorkers' actors hold every CPU; the second's pass waited for ever, silently."""
    first = workers_of(3)
    assert_same(list(make(indexed_list, first)), list(make(indexed_list)))  # its actors now hold the 3 CPUs
    caplog.set_level(logging.WARNING, logger="stallfree.pipeline.ray_workers")
    second = workers_of(2, start_timeout=6)
    held = r"0 of 3 CPUs free \(nodes of 1 and 2 CPUs\): 3 GraphWorker actors of this process \(pid \d+\) hold 3"
    with pytest.raises(TimeoutError, match=r"RayWorkers could not start 2 of its 2 actors \(2 x 1 = 2 CPUs\) on the "
                                           rf"Ray cluster at 127\.0\.0\.1:\d+ within start_timeout=6 s: the cluster "
                                           rf"has {held}; give every Loader the same RayWorkers object"):
        list(make(indexed_list, second))
    # (the first may have waited a moment too: the actors of a test before, ended by ray.kill, end asynchronously)
    warned = [r.getMessage() for r in caplog.records if "RayWorkers waits for 2 of its 2 actors" in r.getMessage()]
    assert len(warned) == 1, caplog.text  # said once, while it waited, before giving up
    assert "(2 x 1 = 2 CPUs)" in warned[0] and "gives up after start_timeout=6 s" in warned[0]
    assert_same(list(make(indexed_list, first)), list(make(indexed_list)))  # the first is untouched


def test_a_worker_larger_than_any_node_fails_after_the_bound_naming_what_exists(
    indexed_list: Path, workers_of: Any
) -> None:
    """``cpus_per_worker=4`` where the largest node has 2: Ray warned, then waited for ever (``ray.init``'s cluster
    never grows)."""
    workers = workers_of(1, cpus_per_worker=4, start_timeout=2)
    lacks = r"has 3 CPUs in all and has no node of 4 CPUs for a worker \(the largest has 2\)"
    with pytest.warns(UserWarning, match=rf"RayWorkers wants 4 CPUs but the cluster at .* {lacks}: .* fail after "
                                         r"start_timeout=2"):
        with pytest.raises(TimeoutError, match=rf"could not start its actor \(4 CPUs\) on the Ray cluster at .* "
                                               rf"within start_timeout=2 s: the cluster has \d+ of 3 CPUs free .*; "
                                               rf"it {lacks}; .*fewer workers or CPUs per worker"):
            list(make(indexed_list, workers))
    with pytest.warns(UserWarning, match=r"wants 4 x 1 = 4 CPUs but the cluster at .* has 3 CPUs in all: "):
        with pytest.raises(TimeoutError, match=r"could not start \d of its 4 actors \(4 x 1 = 4 CPUs\)"):
            list(make(indexed_list, workers_of(4, start_timeout=4)))
