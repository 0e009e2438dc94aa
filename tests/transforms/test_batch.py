"""MixUp and CutMix: torchvision v2's formulas, soft targets, determinism under (seed, epoch, batch), resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from stallfree.transforms import CutMix, MixUp


def batch_of(n: int = 6, shape: tuple[int, ...] = (3, 8, 10), classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return torch.rand((n, *shape), generator=g), torch.randint(0, classes, (n,), generator=g)


def test_mixup_is_torchvisions_formula() -> None:
    images, labels = batch_of()
    mix = MixUp(alpha=0.4, num_classes=5, seed=7)
    lam = mix.lam(0, 0)
    mixed, targets = mix(images, labels)
    torch.testing.assert_close(mixed, lam * images + (1 - lam) * images.roll(1, 0))
    one_hot = torch.nn.functional.one_hot(labels, 5).float()
    torch.testing.assert_close(targets, lam * one_hot + (1 - lam) * one_hot.roll(1, 0))
    torch.testing.assert_close(targets.sum(1), torch.ones(6))
    state = mix.state_dict()
    assert (state["seed"], state["epoch"], state["batch"]) == (7, 0, 1)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_cutmix_pastes_the_neighbours_box_and_mixes_labels_by_area(layout: str) -> None:
    images, labels = batch_of()
    if layout == "NHWC":
        images = images.permute(0, 2, 3, 1).contiguous()
    mix = CutMix(alpha=1.0, num_classes=5, seed=1, layout=layout)
    for b in range(8):
        (x1, y1, x2, y2), lam = mix.box(0, b, 8, 10)
        mixed, targets = mix(images, labels, batch=b)
        chw, src = (mixed.permute(0, 3, 1, 2), images.permute(0, 3, 1, 2)) if layout == "NHWC" else (mixed, images)
        inside = torch.zeros(8, 10, dtype=torch.bool)
        inside[y1:y2, x1:x2] = True
        assert torch.equal(chw[..., inside], src.roll(1, 0)[..., inside])
        assert torch.equal(chw[..., ~inside], src[..., ~inside])
        assert lam == pytest.approx(1 - inside.sum().item() / 80)
        one_hot = torch.nn.functional.one_hot(labels, 5).float()
        torch.testing.assert_close(targets, lam * one_hot + (1 - lam) * one_hot.roll(1, 0))


def test_cutmix_box_follows_torchvision() -> None:
    mix = CutMix(alpha=1.0, num_classes=2, seed=4)
    rng = mix.generator(2, 3)
    lam = rng.beta(1.0, 1.0)
    r_x, r_y = rng.integers(0, 30), rng.integers(0, 20)
    r = 0.5 * np.sqrt(1 - lam)
    w, h = int(r * 30), int(r * 20)
    box = (max(r_x - w, 0), max(r_y - h, 0), min(r_x + w, 30), min(r_y + h, 20))
    assert mix.box(2, 3, 20, 30)[0] == box


@pytest.mark.parametrize("cls", [MixUp, CutMix])
def test_deterministic_and_resumable(cls: type) -> None:
    images, labels = batch_of()
    run = cls(alpha=1.0, num_classes=5, seed=3)
    run.set_epoch(2)
    outs = [run(images, labels) for _ in range(5)]
    state = json.loads(json.dumps(run.state_dict()))
    after = run(images, labels)
    resumed = cls(alpha=1.0, num_classes=5, seed=3)
    resumed.load_state_dict(state)
    again = resumed(images, labels)
    assert torch.equal(after[0], again[0]) and torch.equal(after[1], again[1])
    fresh = cls(alpha=1.0, num_classes=5, seed=3)
    fresh.set_epoch(2)
    assert torch.equal(fresh(images, labels, batch=3)[0], outs[3][0])
    other = cls(alpha=1.0, num_classes=5, seed=3)
    other.set_epoch(3)
    assert not torch.equal(other(images, labels)[0], outs[0][0])
    with pytest.raises(ValueError, match=f"{cls.__name__} state has seed=3 but this {cls.__name__} has seed=4"):
        cls(alpha=1.0, num_classes=5, seed=4).load_state_dict(state)


def test_lam_is_beta_distributed() -> None:
    mix = MixUp(alpha=1.0, num_classes=2)
    lams = np.array([mix.lam(0, b) for b in range(4000)])
    assert abs(lams.mean() - 0.5) < 0.02 and abs(lams.var() - 1 / 12) < 0.01  # Beta(1, 1) is uniform


def test_mixing_keeps_the_device_and_dtype() -> None:
    images, labels = batch_of()
    mixed, targets = MixUp(num_classes=5)(images.double(), labels)
    assert mixed.dtype == torch.float64 and targets.dtype == torch.float64 and mixed.device == images.device


def test_arguments_are_checked() -> None:
    images, labels = batch_of()
    with pytest.raises(ValueError, match="alpha must be a positive number"):
        MixUp(alpha=0, num_classes=5)
    with pytest.raises(ValueError, match="num_classes must be a positive int"):
        CutMix(num_classes=0)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        MixUp(num_classes=3)(images, labels + 3)
    with pytest.raises(ValueError, match="labels must be int64"):
        MixUp(num_classes=5)(images, labels.int())
    with pytest.raises(ValueError, match="images must be floating point"):
        CutMix(num_classes=5)(images.to(torch.uint8), labels)
    with pytest.raises(ValueError, match="layout must be"):
        CutMix(num_classes=5, layout="CHW")
