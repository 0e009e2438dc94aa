"""RandomResize, ScaleJitter and RandomShortestSize in the running CPU graph: the drawn size, resized as PIL."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stallfree import Loader
from stallfree.transforms import CenterCrop
from stallfree.transforms.ops.rescale import RandomResize, RandomShortestSize, ScaleJitter
from stallfree.transforms.random import SampleRandom

PIL_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
               "nearest": Image.Resampling.NEAREST}


@pytest.fixture(scope="module")
def pngs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    root = tmp_path_factory.mktemp("pngs")
    rng = np.random.default_rng(10)
    images, lines = [], ["path,label"]
    for i, (h, w) in enumerate([(30, 40), (41, 23), (32, 32), (17, 50)]):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.png")
        images.append(pixels)
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines))
    return root / "list.csv", images


def center(image: np.ndarray, size: int) -> np.ndarray:
    h, w = image.shape[:2]
    top, left = CenterCrop(size).anchor(h, w)
    pad = np.zeros((max(h, size) + 2 * size, max(w, size) + 2 * size, 3), np.uint8)
    pad[size : size + h, size : size + w] = image
    return pad[size + top : size + top + size, size + left : size + left + size]


STEPS = [
    RandomResize(12, 40),
    RandomResize(12, 40, interpolation="nearest"),
    ScaleJitter((24, 32), (0.5, 1.5), interpolation="bicubic"),
    RandomShortestSize((16, 20, 28), max_size=45),
]


@pytest.mark.parametrize("step", STEPS, ids=lambda s: f"{type(s).__name__}-{s.interpolation}")
def test_each_sample_is_resized_to_its_drawn_size_as_pil(pngs, step) -> None:
    source, originals = pngs
    loader = Loader(source, batch_size=2, transform=[step, CenterCrop(20)], shuffle=False, num_threads=1,
                    dtype="uint8", layout="NHWC", seed=3)
    for images, labels in loader:
        for image, label in zip(images, labels.tolist(), strict=True):
            src = originals[label]
            h, w = step.out_size(SampleRandom(3, 0, label), *src.shape[:2])
            ref = np.asarray(Image.fromarray(src).resize((w, h), PIL_FILTERS[step.interpolation]))
            assert np.array_equal(image.numpy(), center(ref, 20)), f"sample {label} size {(h, w)}"


def test_drawn_sizes_follow_torchvisions_rules() -> None:
    n = 3000
    sizes = [RandomResize(10, 20).out_size(SampleRandom(0, 0, i), 30, 60) for i in range(n)]
    shorts = np.array([s[0] for s in sizes])
    assert shorts.min() == 10 and shorts.max() == 19 and all(s[1] == 2 * s[0] for s in sizes)
    shortest = RandomShortestSize((8, 16), max_size=24)
    picks = {shortest.out_size(SampleRandom(0, 1, i), 10, 20) for i in range(200)}
    assert picks == {(8, 16), (12, 24)}  # 16 on the short side would put 32 on the long one, over 24
    jitter = [ScaleJitter((20, 40), (1.0, 2.0)).out_size(SampleRandom(0, 2, i), 10, 10) for i in range(n)]
    assert min(j[0] for j in jitter) >= 20 and max(j[0] for j in jitter) <= 40


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"RandomResize: needs 0 < min_size < max_size"):
        RandomResize(10, 10)
    with pytest.raises(ValueError, match=r"ScaleJitter: scale_range must be \(min, max\)"):
        ScaleJitter((10, 10), (2.0, 1.0))
    with pytest.raises(ValueError, match=r"RandomShortestSize: min_size must be a positive int or ints"):
        RandomShortestSize([])
    with pytest.raises(ValueError, match=r"ScaleJitter: an image of \(10, 10\) would resize to \(0, 0\)"):
        ScaleJitter((1, 1), (0.1, 0.2)).draw(SampleRandom(0, 0, 0), (10, 10))
