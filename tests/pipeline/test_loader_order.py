"""Exactly-once delivery, resume and echo through the real Loader (labels are row indices)."""

from collections import Counter
from pathlib import Path

import pytest
import torch

from stallfree import Loader
from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()]


def make(source: Path, **kwargs) -> Loader:
    kwargs.setdefault("batch_size", 5)
    kwargs.setdefault("num_threads", 1)
    kwargs.setdefault("shuffle", True)
    return Loader(source, transform=SPEC, seed=3, **kwargs)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_each_sample_exactly_once_across_ranks(indexed_list: Path, world_size: int, drop_last: bool) -> None:
    n = 37
    seen: Counter[int] = Counter()
    for rank in range(world_size):
        loader = make(indexed_list, rank=rank, world_size=world_size, drop_last=drop_last)
        batches = list(loader)
        assert len(batches) == len(loader)
        for images, labels in batches:
            assert images.shape[1:] == (3, 12, 12)
            seen.update(labels.tolist())
    if drop_last:
        per_rank = (n // world_size) // 5 * 5
        assert all(c == 1 for c in seen.values()) and sum(seen.values()) == per_rank * world_size
    else:
        assert set(seen) == set(range(n))
        assert sum(seen.values()) == n + (-n % world_size)


def test_epochs_advance_and_differ(indexed_list: Path) -> None:
    loader = make(indexed_list)
    first = torch.cat([labels for _, labels in loader])
    second = torch.cat([labels for _, labels in loader])
    assert loader.epoch == 2
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(37))
    assert first.tolist() != second.tolist()
    loader.set_epoch(0)
    assert torch.cat([labels for _, labels in loader]).tolist() == first.tolist()


def run_from(loader: Loader, stop: int) -> tuple[dict, list]:
    """Take `stop` batches, return the state and the rest of the epoch from a fresh iterator."""
    it = iter(loader)
    for _ in range(stop):
        next(it)
    state = loader.state_dict()
    return state, list(it)


@pytest.mark.parametrize("stop", [0, 1, 4, 7])
@pytest.mark.parametrize(("echo", "mode"), [(1, "example"), (2, "example"), (3, "batch")])
def test_resume_is_bit_identical(indexed_list: Path, stop: int, echo: int, mode: str) -> None:
    reference = make(indexed_list, echo=echo, echo_mode=mode)
    reference.set_epoch(1)
    state, rest = run_from(reference, stop)
    resumed = make(indexed_list, echo=echo, echo_mode=mode, num_threads=2, prefetch=3)
    resumed.load_state_dict(state)
    again = list(resumed)
    assert len(again) == len(rest)
    for (a, la), (b, lb) in zip(again, rest, strict=True):
        assert torch.equal(la, lb)
        assert torch.equal(a, b), "pixels differ after resume"
    assert resumed.epoch == 2


def test_thread_count_does_not_change_augmentation(indexed_list: Path) -> None:
    one = list(make(indexed_list, num_threads=1))
    two = list(make(indexed_list, num_threads=2, io_threads=1))
    assert all(torch.equal(a, b) and torch.equal(x, y) for (a, x), (b, y) in zip(one, two, strict=True))


def test_same_sample_same_augmentation_on_any_rank(indexed_list: Path) -> None:
    ((images, labels),) = list(make(indexed_list, batch_size=37))
    whole = {int(label): img for img, label in zip(images, labels, strict=True)}
    for images, labels in make(indexed_list, rank=1, world_size=3):
        for img, label in zip(images, labels, strict=True):
            assert torch.equal(img, whole[int(label)])


def test_example_echo_gives_fresh_augmentation(indexed_list: Path) -> None:
    images_by_label: dict[int, list[torch.Tensor]] = {}
    loader = make(indexed_list, echo=2)
    assert len(loader) == 15
    for images, labels in loader:
        for img, label in zip(images, labels, strict=True):
            images_by_label.setdefault(int(label), []).append(img)
    assert all(len(v) == 2 for v in images_by_label.values())
    assert sum(not torch.equal(*v) for v in images_by_label.values()) > 30


def test_batch_echo_repeats_each_batch(indexed_list: Path) -> None:
    batches = list(make(indexed_list, echo=2, echo_mode="batch"))
    assert len(batches) == 16
    for (a, la), (b, lb) in zip(batches[::2], batches[1::2], strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_state_from_other_layout_is_refused(indexed_list: Path) -> None:
    state = make(indexed_list).state_dict()
    with pytest.raises(ValueError, match="batch_size=5 but this Loader has batch_size=6"):
        make(indexed_list, batch_size=6).load_state_dict(state)
