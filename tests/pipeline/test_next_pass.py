"""The next epoch's run starts while this one's last batches are taken: same batches, and it never leaks."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from stallfree import Loader
from stallfree.pipeline import next_pass
from stallfree.pipeline.readers import FileListReader
from stallfree.transforms import RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(16, scale=(0.3, 1.0)), RandomHorizontalFlip()]

# The run started ahead is LocalGraph's, here and in the graph process alike: its mechanics are tested in this process
# (test_process_graph.py checks that the graph process starts the next epoch ahead too).
pytestmark = pytest.mark.usefixtures("graph_in_this_process")


def loader(source: Path) -> Loader:
    return Loader(source, batch_size=8, transform=SPEC, seed=5, dtype="uint8", num_threads=1)


def epoch(source: Path, number: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Epoch ``number`` from a fresh Loader, which has no run started ahead."""
    fresh = loader(source)
    fresh.set_epoch(number)
    return list(fresh)


def same(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    if len(a) != len(b):
        return False
    return all(torch.equal(x, y) and torch.equal(lx, ly) for (x, lx), (y, ly) in zip(a, b, strict=True))


def test_epochs_in_a_row_take_the_run_started_ahead_and_match_fresh_loaders(indexed_list: Path) -> None:
    running = loader(indexed_list)
    first = list(running)
    assert running._epochs.placement._next._run is not None  # started while the last batches were taken
    second = list(running)
    assert same(first, epoch(indexed_list, 0)) and same(second, epoch(indexed_list, 1))
    assert running.epoch == 2


class SlowReads(FileListReader):
    """A file list whose every read takes 5 ms: the loop always waits for the graph, as on a slow disk."""

    def read(self, index: int) -> np.ndarray:
        time.sleep(0.005)
        return super().read(index)


def test_the_next_epoch_starts_before_the_last_batch_is_out_when_the_loop_waits_for_each(
        indexed_list: Path) -> None:
    # issue 36: a loop that waited for each batch took the last one before the graph said it had queued it, and the
    # next epoch was not started ahead at all. Now the reader's end starts it, before the last batch can be out.
    running = Loader(SlowReads(indexed_list), batch_size=8, transform=SPEC, seed=5, dtype="uint8", num_threads=1)
    for _ in range(3):
        it = iter(running)
        for _ in range(len(running)):
            next(it)
        assert running._epochs.placement._next._run is not None  # before the pass has even ended
        with pytest.raises(StopIteration):
            next(it)


def test_another_epoch_or_a_state_elsewhere_discards_it(indexed_list: Path) -> None:
    running = loader(indexed_list)
    list(running)
    running.set_epoch(3)
    assert same(list(running), epoch(indexed_list, 3))
    partway = loader(indexed_list)
    it = iter(partway)
    next(it)
    state = partway.state_dict()
    list(running)  # epoch 4, and epoch 5's run started ahead
    running.load_state_dict(state)  # epoch 0 after its first batch
    assert same(list(running), list(it))


def test_a_run_nobody_takes_stops_by_itself(indexed_list: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(next_pass, "IDLE_S", 0.2)
    running = loader(indexed_list)
    list(running)
    ahead = running._epochs.placement._next._run
    assert ahead is not None
    ahead.join(5.0)
    assert ahead.stopped and not any(thread.is_alive() for thread in ahead._threads)
    assert same(list(running), epoch(indexed_list, 1))  # iter() then starts afresh: the same batches
    running.close()
    assert running._epochs.placement._next._run is None


class _Spans:
    def __init__(self) -> None:
        self.spans: list[tuple[str, int | None]] = []

    def record(self, stage: str, state: str, start: float, end: float, batch: int | None = None) -> None:
        self.spans.append((stage, batch))


def test_the_clock_sees_the_run_started_ahead_only_once_it_is_taken(indexed_list: Path) -> None:
    clock = _Spans()
    running = Loader(indexed_list, batch_size=8, transform=SPEC, seed=5, dtype="uint8", num_threads=1, clock=clock)
    batches = len(list(running))
    ahead = running._epochs.placement._next._run
    assert ahead is not None
    deadline = time.monotonic() + 10.0
    while not ahead.out_q.full() and time.monotonic() < deadline:  # batches of the next epoch are ready, unasked
        time.sleep(0.05)
    assert ahead.out_q.full()
    augmented = [b for stage, b in clock.spans if stage == "augment"]
    assert sorted(augmented) == list(range(batches))
    list(running)
    augmented = [b for stage, b in clock.spans if stage == "augment"]
    assert sorted(augmented) == sorted([*range(batches), *range(batches)])


def test_a_clock_given_to_a_pass_sees_the_whole_pass_started_ahead_without_it(indexed_list: Path) -> None:
    # the profiler gives its clock to the pass it times (loader.iterate); the run started ahead before it reports
    # its held spans to that clock once the pass takes it
    running = loader(indexed_list)
    list(running)
    ahead = running._epochs.placement._next._run
    assert ahead is not None
    clock = _Spans()
    it = running.iterate(clock)
    batches = len(list(it))
    assert it.run is ahead  # taken, whichever clock the pass has
    assert sorted(b for stage, b in clock.spans if stage == "augment") == list(range(batches))


def test_start_has_the_first_batches_ready_before_the_first_iter_and_they_are_the_same(indexed_list: Path) -> None:
    started = loader(indexed_list).start()
    ahead = started._epochs.placement._next._run
    assert ahead is not None and ahead.epoch == 0
    deadline = time.monotonic() + 10.0
    while not ahead.out_q.full() and time.monotonic() < deadline:  # read and run in the graph, unasked
        time.sleep(0.05)
    assert ahead.out_q.full()
    it = iter(started)
    assert it.run is ahead  # iter() took it
    assert same(list(it), epoch(indexed_list, 0))
    assert same(list(started), epoch(indexed_list, 1))


def test_start_then_another_epoch_or_during_a_pass(indexed_list: Path) -> None:
    started = loader(indexed_list).start()
    started.set_epoch(3)  # the run started for epoch 0 is not the one asked for
    assert same(list(started), epoch(indexed_list, 3))
    busy = loader(indexed_list)
    it = iter(busy)
    first = next(it)
    ahead = busy._epochs.placement._next._run  # the pass's reader may have started the next epoch's run already
    assert busy.start() is busy and busy._epochs.placement._next._run is ahead  # during a pass: start() starts nothing
    assert ahead is None or ahead.epoch == 1
    assert same([first, *it], epoch(indexed_list, 0))
    partway = loader(indexed_list)
    part = iter(partway)
    next(part)
    resumed = loader(indexed_list)
    resumed.load_state_dict(partway.state_dict())
    assert resumed.start()._epochs.placement._next._run is None  # inside an epoch: iter() starts there as before
    assert same(list(resumed), list(part))
