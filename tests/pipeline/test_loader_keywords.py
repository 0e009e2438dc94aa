"""DataLoader's keywords on the Loader: each works with DataLoader's meaning or is refused with what to do instead."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from stallfree import Loader
from stallfree.transforms import CenterCrop, Compose, Normalize, Resize

SPEC = [Resize(20), CenterCrop(16), Normalize()]


def batches(source: Path, **kwargs) -> list:
    kwargs.setdefault("transform", SPEC)
    return list(Loader(source, batch_size=8, shuffle=False, num_threads=1, **kwargs))


@pytest.mark.parametrize(
    ("keyword", "value", "instead"),
    [
        ("num_workers", 8, "use num_threads=N"),
        ("persistent_workers", True, "keeps its DALI graph and threads"),
        ("collate_fn", lambda batch: batch, "target_transform="),
        ("sampler", [0, 1, 2], "shuffle=, seed=, rank="),
        ("batch_sampler", [[0, 1]], "batch_size="),
        ("prefetch_factor", 4, "use prefetch=N"),
        ("generator", torch.Generator(), "use seed="),
        ("worker_init_fn", print, "no worker processes"),
    ],
)
def test_dataloader_keywords_are_refused_with_the_stallfree_way(indexed_list, keyword, value, instead) -> None:
    with pytest.raises(TypeError, match=rf"Loader does not take DataLoader's {keyword}=: .*{instead}"):
        Loader(indexed_list, batch_size=8, transform=SPEC, **{keyword: value})


def test_an_unknown_keyword_is_refused_as_python_does(indexed_list) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'shufle'"):
        Loader(indexed_list, batch_size=8, transform=SPEC, shufle=True)


def test_target_transform_applies_to_each_label_and_collates(indexed_list) -> None:
    plain = batches(indexed_list)
    shifted = batches(indexed_list, target_transform=lambda y: y + 100)
    named = batches(indexed_list, target_transform=lambda y: f"item{y}")
    for (images, labels), (images2, labels2), (_, names) in zip(plain, shifted, named, strict=True):
        assert torch.equal(images, images2) and torch.equal(labels2, labels + 100)
        assert names == [f"item{int(y)}" for y in labels]  # default_collate keeps strings as a list


def test_target_transform_must_be_callable(indexed_list) -> None:
    with pytest.raises(ValueError, match="target_transform must be a callable applied to each label, got int"):
        Loader(indexed_list, batch_size=8, transform=SPEC, target_transform=3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the warning is for a machine without CUDA")
def test_pin_memory_without_cuda_warns_as_dataloader(indexed_list) -> None:
    with pytest.warns(UserWarning, match="pin_memory=True but torch sees no CUDA device"):
        loader = Loader(indexed_list, batch_size=8, transform=SPEC, pin_memory=True)
    images, labels = next(iter(loader))
    assert images.device.type == "cpu" and not images.is_pinned()


@pytest.mark.gpu
def test_pin_memory_gives_pinned_cpu_batches(indexed_list) -> None:
    (images, labels), *_ = batches(indexed_list, pin_memory=True)
    assert images.device.type == "cpu" and images.is_pinned() and labels.is_pinned()
    assert torch.equal(images, batches(indexed_list)[0][0])


@pytest.mark.gpu
def test_pin_memory_with_a_cuda_device_is_refused(indexed_list) -> None:
    with pytest.raises(ValueError, match="pin_memory=True pins CPU batches, but device='cuda:0'"):
        Loader(indexed_list, batch_size=8, transform=SPEC, device="cuda", pin_memory=True)


def test_torch_dtype_is_the_same_as_its_name(indexed_list) -> None:
    by_name = batches(indexed_list, dtype="float16")
    by_dtype = batches(indexed_list, dtype=torch.float16)
    assert by_dtype[0][0].dtype == torch.float16
    assert all(torch.equal(a[0], b[0]) for a, b in zip(by_name, by_dtype, strict=True))
    with pytest.raises(ValueError, match="dtype must be one of .*got torch.int32"):
        Loader(indexed_list, batch_size=8, transform=SPEC, dtype=torch.int32)


def test_one_transform_and_compose_are_accepted(indexed_list) -> None:
    (one, _), *_ = batches(indexed_list, transform=CenterCrop(16), dtype="uint8")
    (listed, _), *_ = batches(indexed_list, transform=[CenterCrop(16)], dtype="uint8")
    (composed, _), *_ = batches(indexed_list, transform=Compose(SPEC))
    (plain, _), *_ = batches(indexed_list)
    assert torch.equal(one, listed) and torch.equal(composed, plain)


def test_a_compose_spec_has_the_list_spec_fingerprint(indexed_list) -> None:
    listed = Loader(indexed_list, batch_size=8, transform=SPEC)
    composed = Loader(indexed_list, batch_size=8, transform=Compose(SPEC))
    composed.load_state_dict(listed.state_dict())  # the same spec: the state is accepted
    assert np.array_equal(listed.labels, composed.labels)


def test_a_missing_path_is_named_before_any_other_check(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"dataset {tmp_path / 'nope'} does not exist"):
        Loader(tmp_path / "nope", batch_size=2)  # no transform: the path is still what is wrong


def test_a_with_block_closes_the_loader(image_folder: Path) -> None:
    with Loader(image_folder, batch_size=4, transform=[CenterCrop(8)], num_threads=1) as loader:
        batches = iter(loader)
        next(batches)
    with pytest.raises(RuntimeError, match="close\\(\\) ended this pass"):
        next(batches)


def test_shuffle_defaults_to_dataloaders_false(image_folder: Path) -> None:
    loader = Loader(image_folder, batch_size=64, transform=[CenterCrop(8)], columns=["index"], num_threads=1)
    (_, _, extra), = list(loader)
    assert extra["index"].tolist() == list(range(len(loader.labels)))  # row order, as DataLoader(shuffle=False)
