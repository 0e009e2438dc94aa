"""RandomApply and RandomChoice in the running DALI CPU graph: each sample gets its drawn branch, exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.transforms import CenterCrop, ColorJitter, Normalize, RandomHorizontalFlip, RandomVerticalFlip, Resize
from stallfree.transforms.ops.containers import RandomApply, RandomChoice, RandomOrder
from stallfree.transforms.ops.geometry import Pad
from stallfree.transforms.random import SampleRandom

JITTER = ColorJitter(0.4, 0.4, 0.4, 0.1)


@pytest.fixture(scope="module")
def pngs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    root = tmp_path_factory.mktemp("pngs")
    rng = np.random.default_rng(4)
    images, lines = [], ["path,label"]
    for i in range(12):
        h, w = int(rng.integers(18, 30)), int(rng.integers(18, 30))
        y, x = np.mgrid[0:h, 0:w]
        smooth = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (h + w)], -1)
        pixels = np.clip(smooth + rng.integers(-30, 30, (h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.png")
        images.append(pixels)
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines))
    return root / "list.csv", images


def run(source: Path, transform: list, seed: int) -> list[tuple[int, np.ndarray]]:
    loader = Loader(source, batch_size=6, transform=transform, shuffle=False, num_threads=1, dtype="uint8",
                    layout="NHWC", seed=seed)
    return [(int(label), image.numpy()) for images, labels in loader
            for image, label in zip(images, labels, strict=True)]


def center(image: np.ndarray, size: int) -> np.ndarray:
    top, left = CenterCrop(size).anchor(*image.shape[:2])
    return image[top : top + size, left : left + size]


def test_random_apply_gives_each_sample_the_inner_step_or_the_image(pngs) -> None:
    source, originals = pngs
    applied = 0
    for label, image in run(source, [CenterCrop(16), RandomApply([JITTER], p=0.6)], seed=3):
        crop = center(originals[label], 16)
        rng = SampleRandom(3, 0, label)
        apply = not 0.6 < rng.random()
        params, _ = JITTER.draw(rng, (16, 16))
        expected = JITTER.apply(crop, params["order"], params["factors"]) if apply else crop
        assert np.array_equal(image, expected), f"sample {label} applied {apply}"
        applied += apply
    assert 0 < applied < len(originals)


def test_random_apply_of_several_steps_that_change_the_size(pngs) -> None:
    source, originals = pngs
    steps = [RandomApply([Pad(3, fill=50), RandomHorizontalFlip(1.0)], p=0.5), CenterCrop(20)]
    for label, image in run(source, steps, seed=8):
        src = originals[label]
        if not 0.5 < SampleRandom(8, 0, label).random():
            src = np.pad(src, ((3, 3), (3, 3), (0, 0)), constant_values=50)[:, ::-1]
        padded = np.zeros((max(20, src.shape[0]), max(20, src.shape[1]), 3), np.uint8)  # CenterCrop pads with 0
        top, left = (padded.shape[0] - src.shape[0]) // 2, (padded.shape[1] - src.shape[1]) // 2
        padded[top : top + src.shape[0], left : left + src.shape[1]] = src
        assert np.array_equal(image, center(padded, 20)), f"sample {label}"


def test_random_choice_gives_each_sample_its_drawn_branch(pngs) -> None:
    source, originals = pngs
    choice = RandomChoice([RandomHorizontalFlip(1.0), RandomVerticalFlip(1.0), JITTER], p=[1, 1, 2])
    chosen = set()
    for label, image in run(source, [CenterCrop(16), choice], seed=5):
        crop = center(originals[label], 16)
        rng = SampleRandom(5, 0, label)
        k = choice.choose(rng)
        RandomHorizontalFlip(1.0).draw(rng, (16, 16))
        RandomVerticalFlip(1.0).draw(rng, (16, 16))
        params, _ = JITTER.draw(rng, (16, 16))
        expected = [crop[:, ::-1], crop[::-1], JITTER.apply(crop, params["order"], params["factors"])][k]
        assert np.array_equal(image, expected), f"sample {label} branch {k}"
        chosen.add(k)
    assert chosen == {0, 1, 2}


def test_random_order_applies_every_step_in_the_drawn_order(pngs) -> None:
    # Padding and contrast do not commute (contrast blends towards the image's mean, which the padding moves).
    source, originals = pngs
    pad, contrast = Pad(3, fill=200), ColorJitter(contrast=(0.2, 0.5))
    orders = set()
    for label, image in run(source, [CenterCrop(16), RandomOrder([pad, contrast]), CenterCrop(22)], seed=7):
        out = center(originals[label], 16)
        rng = SampleRandom(7, 0, label)
        order = rng.permutation(2)
        for k in order:
            if k == 0:
                out = np.pad(out, ((3, 3), (3, 3), (0, 0)), constant_values=200)
            else:
                params, _ = contrast.draw(rng, out.shape[:2])
                out = contrast.apply(out, params["order"], params["factors"])
        assert np.array_equal(image, out), f"sample {label} order {order}"
        orders.add(tuple(order))
    assert orders == {(0, 1), (1, 0)}


def test_a_choice_of_a_step_that_changes_nothing_keeps_the_image(pngs) -> None:
    source, originals = pngs
    choice = RandomChoice([RandomHorizontalFlip(1.0), ColorJitter(), RandomHorizontalFlip(0.0)])
    kept = 0
    for label, image in run(source, [CenterCrop(16), choice], seed=9):
        crop = center(originals[label], 16)
        k = choice.choose(SampleRandom(9, 0, label))
        assert np.array_equal(image, crop[:, ::-1] if k == 0 else crop), f"sample {label} branch {k}"
        kept += k > 0
    assert 0 < kept < len(originals)


def test_nested_containers_and_a_float_image(pngs) -> None:
    source, _ = pngs
    nested = RandomChoice([RandomApply([RandomHorizontalFlip(1.0)], p=0.5), Resize((16, 16))])
    loader = Loader(source, batch_size=6, transform=[CenterCrop(16), Normalize((0.5,), (0.5,)), nested],
                    shuffle=False, num_threads=1)
    images = torch.cat([x for x, _ in loader])
    assert images.shape == (12, 3, 16, 16) and images.dtype == torch.float32


@pytest.mark.slow
def test_draws_follow_the_probabilities() -> None:
    n = 20000
    apply = RandomApply([JITTER], p=0.8)
    rate = np.mean([apply.draw(SampleRandom(0, 0, i), (8, 8))[0]["apply"] for i in range(n)])
    assert abs(rate - 0.8) < 4 * np.sqrt(0.8 * 0.2 / n)
    choice = RandomChoice([RandomHorizontalFlip(1.0), RandomVerticalFlip(1.0), JITTER], p=[1, 3, 6])
    counts = np.bincount([choice.choose(SampleRandom(0, 1, i)) for i in range(n)], minlength=3)
    expected = n * np.array([0.1, 0.3, 0.6])
    assert ((counts - expected) ** 2 / expected).sum() < 13.8  # chi-square, 2 degrees of freedom, p = 0.001


def test_bad_containers_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"RandomApply: transforms\[0\] is Normalize"):
        RandomApply([Normalize()])
    with pytest.raises(TypeError, match=r"RandomApply takes a non-empty list of stallfree transforms"):
        RandomApply(JITTER)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"RandomChoice: p needs one weight per transform \(transforms: 2, p: 3\)"):
        RandomChoice([JITTER, RandomHorizontalFlip()], p=[1, 2, 3])
    with pytest.raises(ValueError, match=r"RandomApply: p must be in \[0, 1\], got 1.5"):
        RandomApply([JITTER], p=1.5)
