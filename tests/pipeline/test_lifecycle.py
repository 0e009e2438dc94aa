"""A Loader forked, pickled or deep-copied goes on from where it stood, with a graph of its own (issue 44, item 15).

Regressions: a Loader iterated, then ``os.fork()``: the child's next pass hung (40 s, no error), waiting on the run
the parent had started ahead, whose threads did not come with the fork; ``pickle.dumps(loader)`` failed with
"cannot pickle 'weakref.ReferenceType' object" and ``copy.deepcopy`` after a pass with "cannot pickle ...
Pipeline", neither naming the Loader.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import torch

from stallfree import Loader, RayWorkers
from stallfree.bench.servers import RangeServer
from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()]
CHILD_S = 120  # a child still running after this long is killed (SIGALRM), so a hang fails instead of waiting

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def make(source: Any, **kwargs: Any) -> Loader:
    return Loader(source, batch_size=5, transform=SPEC, seed=3, shuffle=True, num_threads=1, **kwargs)


def batches(iterable: Iterable[Any]) -> Batches:
    return [(images, labels) for images, labels in iterable]


def same(a: Batches, b: Batches) -> bool:
    pairs = zip(a, b, strict=False)  # lengths compared first
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(i, j) for (x, i), (y, j) in pairs)


def in_fork(work: Callable[[], Any]) -> Any:
    """What ``work()`` returns in a forked child (its error as ``"Type: message"``), which is killed if it hangs."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it never returns into pytest, and ends with os._exit (as multiprocessing's do)
        try:
            os.close(read)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(CHILD_S)
            try:
                result = work()
            except BaseException as err:  # noqa: BLE001 - the parent asserts on it
                result = f"{type(err).__name__}: {err}"
            with os.fdopen(write, "wb") as pipe:
                pickle.dump(result, pipe)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert data, f"the forked child gave no answer (wait status {status}; killed after {CHILD_S} s if it hung)"
    return pickle.loads(data)


# -- os.fork ----------------------------------------------------------------------------------------------------


def test_a_forked_child_goes_on_with_a_graph_of_its_own(indexed_list: Path) -> None:
    loader = make(indexed_list)
    batches(loader)  # the parent's pass; its reader started epoch 1's run ahead
    # Before: the child's pass took that run, whose threads stayed in the parent, and waited for ever.
    got = in_fork(lambda: (batches(loader), batches(loader)))
    assert not isinstance(got, str), got
    assert same(got[0], batches(loader)) and same(got[1], batches(loader)), "epochs 1 and 2, as the parent's"


def test_a_child_forked_mid_pass_goes_on_from_the_last_batch_delivered(indexed_list: Path) -> None:
    loader = make(indexed_list)
    it = iter(loader)
    next(it)
    next(it)

    def child() -> tuple[str, Batches]:
        try:
            next(it)
            stale = "the parent's iterator went on in the child"
        except RuntimeError as err:
            stale = str(err)
        return stale, batches(loader)

    stale, rest = in_fork(child)
    assert "a fork of it: its threads did not come with the fork; iterate the Loader again" in stale
    assert same(rest, batches(it)), "the child's pass: the rest of the epoch, as the parent's iterator gives it"


def test_a_remote_loader_is_refused_in_a_forked_child_at_once(http_server: RangeServer, tmp_path: Path) -> None:
    loader = make(http_server.url, cache_dir=tmp_path)
    batches(loader)
    got = in_fork(lambda: batches(loader))
    assert got.startswith("RuntimeError: this Loader was built in process ")
    assert "build a new Loader in this process (with a cache_dir of its own)" in got


# -- pickle, deepcopy -------------------------------------------------------------------------------------------


def test_a_pickled_loader_is_its_configuration_and_where_it_stands(indexed_list: Path) -> None:
    loader = make(indexed_list)
    # Before: TypeError: cannot pickle 'weakref.ReferenceType' object
    fresh = pickle.loads(pickle.dumps(loader))
    assert same(batches(fresh), batches(loader))
    it = iter(loader)
    next(it)
    next(it)
    middle = pickle.loads(pickle.dumps(loader))  # taken mid-pass: from the last batch delivered, as state_dict()
    assert middle.state_dict() == loader.state_dict()
    assert same(batches(middle), batches(it))
    # Before: TypeError: cannot pickle '...Pipeline' object (the graph a pass had built)
    after = copy.deepcopy(loader)
    assert same(batches(after), batches(loader)), "the next epoch, on both"


@pytest.mark.slow
def test_a_loader_goes_to_a_spawned_process_pickled(indexed_list: Path) -> None:
    loader = make(indexed_list)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        there = pool.apply(list, (loader,))  # its graph and threads are made in the spawned process
    assert same(batches(there), batches(loader))


def test_a_loader_with_ray_workers_is_refused_by_name(indexed_list: Path) -> None:
    loader = Loader(indexed_list, 5, transform=[CenterCrop(8)], workers=RayWorkers(num_workers=1))
    with pytest.raises(TypeError, match=r"a Loader with workers=RayWorkers\(...\) cannot be pickled or copied: .* "
                                        "build the Loader where it is used"):
        pickle.dumps(loader)
