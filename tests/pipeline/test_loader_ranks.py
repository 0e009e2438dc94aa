"""A Loader's rank is decided when its pass starts, and any rank resumes from any rank's state (issue 44, items 2-3).

Regressions: a Loader built at the top of a Lightning DDP script raised on rank 1 ("environment variable WORLD_SIZE
is set but RANK is not": Lightning's launcher sets WORLD_SIZE, LOCAL_RANK and NODE_RANK) and read everything on
rank 0 (built before the process group); and a state from rank 0 was refused on rank 1 ("Loader state has rank=0
but this Loader has rank=1"), which is what Lightning loads on every rank.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()]
LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)


def make(source: Any, **kwargs: Any) -> Loader:
    kwargs.setdefault("transform", SPEC)
    kwargs.setdefault("shuffle", True)
    return Loader(source, batch_size=5, seed=3, num_threads=1, **kwargs)


def batches(loader: Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images, labels) for images, labels in loader]


def same(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    pairs = zip(a, b, strict=False)  # lengths compared first
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(i, j) for (x, i), (y, j) in pairs)


def labels_of(got: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    return torch.cat([labels for _, labels in got]).tolist()


# -- item 2: the rank is the process's when a pass starts --------------------------------------------------------


def test_a_loader_built_before_the_launcher_set_the_rank_follows_it(indexed_list: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    loader = make(indexed_list)  # built at the top of the script, before the process group exists
    assert len(loader) == 8 and loader.sampler.world_size == 1  # 37 samples: nothing says it is one of two yet
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # Before: the rank was fixed when the Loader was built, so this rank read every sample (rank 0 of 1).
    assert len(loader) == 4
    assert same(batches(loader), batches(make(indexed_list, rank=1, world_size=2)))
    assert loader.state_dict()["rank"] == 1 and loader.fingerprint()["world_size"] == 2


@pytest.mark.parametrize(
    ("env", "rank", "world"),
    [
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "1", "NODE_RANK": "0"}, 1, 2),  # what Lightning's launcher sets
        ({"WORLD_SIZE": "4", "LOCAL_RANK": "1", "NODE_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 3, 4),
        ({"WORLD_SIZE": "4", "LOCAL_RANK": "0", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 2, 4),
    ],
)
def test_lightnings_launcher_environment_gives_the_rank(indexed_list: Path, monkeypatch: pytest.MonkeyPatch,
                                                        env: dict[str, str], rank: int, world: int) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # Before: "environment variable WORLD_SIZE is set but RANK is not" when the Loader was built.
    loader = make(indexed_list)
    assert labels_of(batches(loader)) == labels_of(batches(make(indexed_list, rank=rank, world_size=world)))


def test_a_rank_only_the_process_group_can_tell_is_asked_for_at_the_pass(indexed_list: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1 of Lightning's launcher without LOCAL_WORLD_SIZE: the process group says the rank when fit makes it."""
    for name, value in {"WORLD_SIZE": "4", "LOCAL_RANK": "1", "NODE_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    loader = make(indexed_list)  # built: nothing to refuse yet
    with pytest.raises(ValueError, match=r"NODE_RANK=1 and LOCAL_RANK=1 without RANK or LOCAL_WORLD_SIZE .*"
                                         r"init_process_group"):
        iter(loader)


def test_a_state_loaded_before_the_process_group_is_read_again_for_the_rank_the_pass_runs_on(
    indexed_list: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rank1 = make(indexed_list, rank=1, world_size=2)
    it = iter(rank1)
    next(it)
    state, rest = json.loads(json.dumps(rank1.state_dict())), list(it)
    loader = make(indexed_list)
    loader.load_state_dict(state)  # before the launcher's variables: read as rank 0 of 1, elastically
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert same(batches(loader), rest)


# -- item 3: any rank resumes from any rank's state --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "taken"),
    [
        ({}, 2),
        ({"drop_last": True}, 3),
        ({"echo": 2, "echo_mode": "batch"}, 3),  # between the two deliveries of batch 1
        ({}, 4),  # the epoch's last batch
    ],
)
def test_rank_1_resumes_from_rank_0s_state_as_its_own_run_goes_on(indexed_list: Path, kwargs: dict[str, Any],
                                                                   taken: int) -> None:
    rank0 = make(indexed_list, rank=0, world_size=2, **kwargs)
    it = iter(rank0)
    for _ in range(taken):
        next(it)
    state = json.loads(json.dumps(rank0.state_dict()))  # what Lightning saves, and loads on every rank
    assert "rank" not in state["fingerprint"]
    uninterrupted = make(indexed_list, rank=1, world_size=2, **kwargs)
    whole = batches(uninterrupted) + batches(uninterrupted)  # this epoch and the next
    resumed = make(indexed_list, rank=1, world_size=2, **kwargs)
    # Before: ValueError("Loader state has rank=0 but this Loader has rank=1").
    resumed.load_state_dict(state)
    assert same(batches(resumed) + batches(resumed), whole[taken:]), "bit-identical from the next batch on"


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def one_bad_row(tmp_path: Path) -> Path:
    """12 rows labelled by index; row 2 (rank 0's second sample of 2 ranks, in row order) is not an image."""
    lines = ["path,label"]
    for i in range(12):
        (tmp_path / f"{i:02d}.png").write_bytes(b"not an image" if i == 2 else png(i))
        lines.append(f"{i:02d}.png,{i}")
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")
    return tmp_path / "list.csv"


def skipping(source: Path, rank: int) -> Loader:
    return Loader(source, 2, transform=[CenterCrop(8)], dtype="uint8", num_threads=1, on_error="skip", rank=rank,
                  world_size=2)


def taken_after(loader: Loader, count: int) -> tuple[list[list[int]], dict[str, Any]]:
    """The labels of ``loader``'s first ``count`` batches, and its state after them (through JSON)."""
    it = iter(loader)
    labels = [next(it)[1].tolist() for _ in range(count)]
    return labels, json.loads(json.dumps(loader.state_dict()))


OTHER_RANK = r"rank {} resumes from rank {}'s Loader state: with on_error='skip' .* load each rank's own state_dict"


def test_skipped_samples_are_each_ranks_own(one_bad_row: Path) -> None:
    # Rank 0 (rows 0, 2, 4, ... in row order) skips row 2; rank 1 (rows 1, 3, 5, ...) skips nothing.
    labels, state = taken_after(skipping(one_bad_row, 0), 2)
    assert labels == [[0, 4], [6, 8]] and [s["index"] for s in state["skipped"]] == [2]
    assert state["batcher"]["position"] == 5
    rank1 = skipping(one_bad_row, 1)
    with pytest.warns(UserWarning, match=OTHER_RANK.format(1, 0)):
        rank1.load_state_dict(state)
    assert rank1.skipped == [] and rank1.state_dict()["batcher"]["position"] == 4, (
        "after its own 2 batches, none skipped")
    assert [labels.tolist() for _, labels in rank1] == [[9, 11]], "as its uninterrupted run goes on"


def test_a_rank_that_skipped_before_another_ranks_state_delivers_as_many_samples_again(one_bad_row: Path) -> None:
    labels, state = taken_after(skipping(one_bad_row, 1), 2)
    assert labels == [[1, 3], [5, 7]] and state["skipped"] == []
    uninterrupted = [labels.tolist() for _, labels in skipping(one_bad_row, 0)]
    assert uninterrupted == [[0, 4], [6, 8], [10, 0]], "row 2 skipped: the epoch ends on the wrap"
    rank0 = skipping(one_bad_row, 0)
    with pytest.warns(UserWarning, match=OTHER_RANK.format(0, 1)):
        rank0.load_state_dict(state)
    # Its own skip of row 2 is not in rank 1's state: it stands at position 4, where a rank that skipped nothing
    # would, so row 8 (delivered before the state) comes again where its run would have given row 0 again.
    assert [labels.tolist() for _, labels in rank0] == [[8, 10]]


def test_a_state_from_before_issue_44_names_its_rank_in_its_fingerprint(indexed_list: Path) -> None:
    rank0 = make(indexed_list, rank=0, world_size=2)
    it = iter(rank0)
    next(it)
    state = json.loads(json.dumps(rank0.state_dict()))
    old = {**{k: v for k, v in state.items() if k not in ("rank", "batcher", "sampler", "rejected")},
           **state["batcher"], **state["sampler"], "version": 3,
           "fingerprint": {**state["fingerprint"], "rank": 0}}  # as version 3 wrote it, flat
    rest = list(it)
    again = make(indexed_list, rank=0, world_size=2)
    again.load_state_dict(old)
    assert same(batches(again), rest)
    with pytest.raises(ValueError, match=r"Loader state has rank=2: expected an int in 0\.\.1"):
        again.load_state_dict({**state, "rank": 2})
