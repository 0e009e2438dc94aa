"""One pass at a time, what a new pass starts from, and the fingerprint a state carries (issue 10, items 2-5)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from stallfree import DatasetReader, Loader
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions
from stallfree.pipeline.readers import FileListReader
from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()]


def make(source: object, **kwargs) -> Loader:
    kwargs.setdefault("transform", SPEC)
    kwargs.setdefault("shuffle", True)
    return Loader(source, batch_size=5, seed=3, num_threads=1, **kwargs)  # type: ignore[arg-type]


def labels_of(batches: list) -> list[int]:
    return torch.cat([labels for _, labels in batches]).tolist()


def epoch_labels(source: Path, epoch: int) -> list[int]:
    loader = make(source)
    loader.set_epoch(epoch)
    return labels_of(list(loader))


# -- item 3: a stale iterator ---------------------------------------------------------------------------------


def test_a_new_iter_ends_the_previous_pass(indexed_list: Path) -> None:
    loader = make(indexed_list)
    it1 = iter(loader)
    next(it1)
    it2 = iter(loader)
    first = next(it2)
    epoch, state = loader.epoch, loader.state_dict()
    # Before: list(it1) ran on, moved loader.epoch forward and reset the state while it2 was mid-epoch.
    with pytest.raises(RuntimeError, match=r"a newer iter\(\) started a new pass"):
        next(it1)
    assert loader.epoch == epoch and loader.state_dict() == state, "the stale iterator changed the Loader"
    rest = list(it2)
    assert len(rest) == len(loader) - 1
    assert labels_of([first, *rest]) == epoch_labels(indexed_list, 1)


def test_set_epoch_and_load_state_dict_end_the_pass_too(indexed_list: Path) -> None:
    loader = make(indexed_list)
    it = iter(loader)
    next(it)
    loader.set_epoch(4)
    with pytest.raises(RuntimeError, match=r"set_epoch\(\) ended this pass"):
        next(it)
    assert labels_of(list(loader)) == epoch_labels(indexed_list, 4)


# -- item 4: a break starts the next epoch --------------------------------------------------------------------


def test_a_pass_after_a_break_starts_the_next_epoch(indexed_list: Path) -> None:
    loader = make(indexed_list)
    for _ in loader:
        break
    # Before: the next pass replayed epoch 0's permutation; torch's DataLoader(shuffle=True) draws a new one.
    state = loader.state_dict()
    assert (state["epoch"], state["batcher"]["position"], state["batcher"]["batches"]) == (1, 0, 0), (
        "the state says where iter() starts")
    assert labels_of(list(loader)) == epoch_labels(indexed_list, 1)
    assert loader.epoch == 2


def test_a_pass_after_an_abandoned_iterator_starts_the_next_epoch(indexed_list: Path) -> None:
    loader = make(indexed_list)
    it = iter(loader)
    next(it)
    assert loader.state_dict()["batcher"]["batches"] == 1, "a live iterator is mid-epoch: its state resumes there"
    assert labels_of(list(loader)) == epoch_labels(indexed_list, 1)
    loader.set_epoch(0)
    for _ in loader:
        break
    loader.set_epoch(0)  # an explicit choice wins over the advance
    assert labels_of(list(loader)) == epoch_labels(indexed_list, 0)


def test_resume_after_a_state_taken_mid_epoch_still_continues_that_epoch(indexed_list: Path) -> None:
    loader = make(indexed_list)
    it = iter(loader)
    taken = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = list(it)
    loader.load_state_dict(state)
    again = list(loader)
    assert len(again) == len(rest) == len(loader) - len(taken)
    assert all(torch.equal(a, b) and torch.equal(x, y) for (a, x), (b, y) in zip(again, rest, strict=True))
    assert loader.epoch == 1


# -- issue 44, item 12: an iterator dropped before its first batch ----------------------------------------------


def test_an_iterator_dropped_before_its_first_batch_leaves_the_epoch_as_it_was(indexed_list: Path) -> None:
    loader = make(indexed_list)
    iter(loader)  # Lightning's fit loop so checks that a dataloader is iterable, then iterates it
    # Before: the dropped pass counted as an epoch, so this pass drew epoch 1's order (under Lightning with
    # reload_dataloaders_every_n_epochs=1, epoch 1 trained epoch 2's permutation).
    assert labels_of(list(loader)) == epoch_labels(indexed_list, 0)
    unused = iter(loader)
    assert labels_of(list(loader)) == epoch_labels(indexed_list, 1), "a newer iter() ends it: still epoch 1"
    with pytest.raises(RuntimeError, match=r"a newer iter\(\) started a new pass"):
        next(unused)
    for _ in loader:
        break
    assert labels_of(list(loader)) == epoch_labels(indexed_list, 3), "a pass that delivered a batch is an epoch"


def test_a_loaded_state_outlives_an_iterator_dropped_before_its_first_batch(indexed_list: Path) -> None:
    loader = make(indexed_list)
    it = iter(loader)
    next(it)
    next(it)
    state, rest = json.loads(json.dumps(loader.state_dict())), list(it)
    resumed = make(indexed_list)
    resumed.load_state_dict(state)
    iter(resumed)
    again = list(resumed)
    assert all(torch.equal(a, b) and torch.equal(x, y) for (a, x), (b, y) in zip(again, rest, strict=True))


# -- item 2: a state from another configuration ---------------------------------------------------------------


@pytest.fixture(scope="module")
def other_list(indexed_list: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another 37-row dataset: same size, same labels, other files."""
    root = tmp_path_factory.mktemp("other")
    lines = indexed_list.read_text().splitlines()
    for line in lines[1:]:
        name = line.split(",")[0]
        shutil.copy(indexed_list.parent / name, root / f"other-{name}")
    (root / "list.csv").write_text("\n".join([lines[0], *[f"other-{line}" for line in lines[1:]]]) + "\n")
    return root / "list.csv"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"shuffle": False}, "shuffle"),
        ({"drop_last": True}, "drop_last"),
        ({"echo": 2}, "echo"),
        ({"echo": 2, "echo_mode": "batch"}, "echo"),
        ({"transform": [RandomResizedCrop(12), Normalize()]}, "transform"),
        ({"transform": [RandomResizedCrop(12, scale=(0.5, 1.0)), RandomHorizontalFlip(), Normalize()]}, "transform"),
        ({"dtype": "float16"}, "dtype"),
        ({"layout": "NHWC"}, "layout"),
    ],
)
def test_state_from_another_configuration_is_refused(indexed_list: Path, kwargs: dict, field: str) -> None:
    loader = make(indexed_list)
    it = iter(loader)
    next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    # Before: it loaded silently and resumed into a different order or different pixels.
    with pytest.raises(ValueError, match=rf"Loader state has {field}=.* but this Loader has {field}="):
        make(indexed_list, **kwargs).load_state_dict(state)


def test_state_from_another_dataset_of_the_same_size_is_refused(indexed_list: Path, other_list: Path) -> None:
    state = make(indexed_list).state_dict()
    with pytest.raises(ValueError, match="Loader state has source=.* but this Loader has source="):
        make(other_list).load_state_dict(state)


def test_a_moved_dataset_keeps_its_fingerprint(indexed_list: Path, tmp_path: Path) -> None:
    """The source identity is the files relative to the dataset's root and their labels, not where it lies."""
    moved = tmp_path / "moved"
    shutil.copytree(indexed_list.parent, moved)
    loader = make(indexed_list)
    it = iter(loader)
    next(it)
    state, rest = loader.state_dict(), list(it)
    resumed = make(moved / indexed_list.name)
    resumed.load_state_dict(state)
    assert labels_of(list(resumed)) == labels_of(rest)


def test_a_relabelled_dataset_is_refused(indexed_list: Path, tmp_path: Path) -> None:
    lines = indexed_list.read_text().splitlines()
    (tmp_path / "relabelled.csv").write_text("\n".join([lines[0], *[f"{ln.split(',')[0]},0" for ln in lines[1:]]]))
    shutil.copytree(indexed_list.parent, tmp_path, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.csv"))
    state = make(indexed_list).state_dict()
    with pytest.raises(ValueError, match="Loader state has source="):
        make(tmp_path / "relabelled.csv").load_state_dict(state)


def test_shards_are_identified_by_their_checksums(indexed_list: Path, other_list: Path, tmp_path: Path) -> None:
    ingest(indexed_list, tmp_path / "a", IngestOptions())
    ingest(other_list, tmp_path / "b", IngestOptions())
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")
    state = make(tmp_path / "a").state_dict()
    make(tmp_path / "a-copy").load_state_dict(state)
    with pytest.raises(ValueError, match="Loader state has source="):
        make(tmp_path / "b").load_state_dict(state)


class Items(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, source: Path, labels: list[int] | None = None):
        self.reader = FileListReader(source)
        self.targets = labels if labels is not None else self.reader.labels().tolist()

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        return self.reader.paths[index].read_bytes(), self.targets[index]


def test_a_dataset_is_identified_by_its_type_length_and_labels(indexed_list: Path) -> None:
    state = make(Items(indexed_list), transform=[CenterCrop(12)]).state_dict()
    make(Items(indexed_list), transform=[CenterCrop(12)]).load_state_dict(state)
    with pytest.raises(ValueError, match="Loader state has source="):
        make(Items(indexed_list, [0] * 37), transform=[CenterCrop(12)]).load_state_dict(state)
    with pytest.raises(ValueError, match="Loader state has source="):
        make(DatasetReader(Items(indexed_list), labels=[1] * 37), transform=[CenterCrop(12)]).load_state_dict(state)


# -- item 5: RANK / WORLD_SIZE without a process group ---------------------------------------------------------


def test_rank_and_world_size_come_from_the_environment(indexed_list: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # Before: every rank read everything (rank 0 of 1) when the Loader was built before init_process_group.
    loader = make(indexed_list)
    assert (loader.sampler.rank, loader.sampler.world_size) == (1, 2)
    assert labels_of(list(loader)) == labels_of(list(make(indexed_list, rank=1, world_size=2)))


def test_explicit_rank_and_world_size_win_over_the_environment(indexed_list: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = make(indexed_list, rank=0, world_size=1)
    assert (loader.sampler.rank, loader.sampler.world_size) == (0, 1)
    assert make(indexed_list, rank=1).sampler.world_size == 4


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "one", "WORLD_SIZE": "2"}, "environment variable RANK='one' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, r"RANK=2 is not in \[0, WORLD_SIZE=2\)"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be >= 1"),
        ({"RANK": "1"}, "RANK is set but WORLD_SIZE is not"),
    ],
)
def test_an_inconsistent_environment_is_refused(indexed_list: Path, monkeypatch: pytest.MonkeyPatch, env: dict,
                                                match: str) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        make(indexed_list)
