"""torchvision v2's RandomResize, ScaleJitter and RandomShortestSize: translated, sized and resized as torchvision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ks import ks_statistic
from PIL import Image

from stallfree import Loader
from stallfree.transforms.ops.rescale import RandomResize, RandomShortestSize, ScaleJitter
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.translation.translator import to_steps

pytestmark = pytest.mark.torchvision


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(15)
    for i in range(8):
        h, w = int(rng.integers(20, 40)), int(rng.integers(20, 40))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        (root / f"class{i % 2}").mkdir(exist_ok=True)
        Image.fromarray(pixels).save(root / f"class{i % 2}" / f"{i:02d}.png")
    return root



def test_translation_keeps_the_parameters() -> None:
    import torchvision.transforms.v2 as T

    bicubic = T.InterpolationMode.BICUBIC
    steps = to_steps([T.RandomResize(10, 30, interpolation=bicubic), T.ScaleJitter((20, 30), (0.5, 1.5)),
                      T.RandomShortestSize([8, 12], max_size=40), T.CenterCrop(8)]).steps
    assert steps[:3] == (RandomResize(10, 30, "bicubic"), ScaleJitter((20, 30), (0.5, 1.5)),
                         RandomShortestSize((8, 12), 40))


@pytest.mark.parametrize("name", ["RandomResize", "ScaleJitter", "RandomShortestSize"])
def test_each_sample_equals_torchvisions_resize_to_the_drawn_size(folder, name) -> None:
    import torchvision.transforms.v2 as T
    import torchvision.transforms.v2.functional as F
    from torchvision.datasets import ImageFolder

    theirs = {"RandomResize": T.RandomResize(16, 40), "ScaleJitter": T.ScaleJitter((24, 30), (0.6, 1.4)),
              "RandomShortestSize": T.RandomShortestSize([18, 22, 30], max_size=50)}[name]
    recipe = T.Compose([theirs, T.CenterCrop(24), T.ToImage()])
    ours = to_steps(recipe).steps[0]
    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=recipe, seed=8, num_threads=1, columns=["index"])
    for images, _labels, extra in loader:
        for image, index in zip(images, extra["index"].tolist(), strict=True):
            pil, _ = plain[index]
            size = list(ours.out_size(SampleRandom(8, 0, index), pil.height, pil.width))
            expected = F.pil_to_tensor(F.center_crop(F.resize(pil, size), [24, 24]))
            assert torch.equal(image, expected), f"sample {index} size {size}"


def test_scale_jitter_sizes_are_torchvisions_float32_arithmetic() -> None:
    low, high, target = 0.1, 2.0, (33, 47)
    ours = ScaleJitter(target, (low, high))
    for i in range(3000):
        h, w = 17 + i % 50, 23 + i % 71
        u = SampleRandom(0, 0, i).random()
        scale = low + torch.tensor([u], dtype=torch.float32) * (high - low)
        r = min(target[1] / h, target[0] / w) * scale
        assert ours.out_size(SampleRandom(0, 0, i), h, w) == (int(h * r), int(w * r)), (h, w, u)


def test_drawn_sizes_match_torchvision_by_ks() -> None:
    import torchvision.transforms.v2 as T

    n, pil = 3000, Image.new("RGB", (37, 23))
    torch.manual_seed(0)
    bound = 1.95 * np.sqrt(2 / n)  # the two-sample statistic's 0.001 critical value
    pairs = [(T.RandomResize(10, 40), RandomResize(10, 40)),
             (T.ScaleJitter((30, 30), (0.5, 2.0)), ScaleJitter((30, 30), (0.5, 2.0))),
             (T.RandomShortestSize([10, 14, 30], max_size=60), RandomShortestSize((10, 14, 30), 60))]
    for k, (theirs, ours) in enumerate(pairs):
        theirs_sizes = []
        for _ in range(n):
            size = theirs.make_params([pil])["size"]
            theirs_sizes.append(size[0] if len(size) == 1 else min(size))  # RandomResize gives the short side
        ours_sizes = [min(ours.out_size(SampleRandom(0, k, i), 23, 37)) for i in range(n)]
        assert ks_statistic(np.array(ours_sizes, float), np.array(theirs_sizes, float)) < bound, type(ours).__name__
