"""torchvision's RandomApply and RandomChoice: translated, run in the graph, and drawn as torchvision draws them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ks import ks_statistic
from PIL import Image

from stallfree import Loader
from stallfree.transforms import CenterCrop, ColorJitter, RandomHorizontalFlip
from stallfree.transforms.ops.containers import RandomApply, RandomChoice, RandomOrder
from stallfree.transforms.ops.geometry import Pad
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.translation.translator import to_steps

pytestmark = pytest.mark.torchvision


def api(version: str):
    if version == "v1":
        import torchvision.transforms as T
    else:
        import torchvision.transforms.v2 as T
    return T


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(12)
    for i in range(12):
        h, w = int(rng.integers(24, 36)), int(rng.integers(24, 36))
        y, x = np.mgrid[0:h, 0:w]
        smooth = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (h + w)], -1)
        pixels = np.clip(smooth + rng.integers(-30, 30, (h, w, 3)), 0, 255).astype(np.uint8)
        (root / f"class{i % 2}").mkdir(exist_ok=True)
        Image.fromarray(pixels).save(root / f"class{i % 2}" / f"{i:02d}.png")
    return root



@pytest.mark.parametrize("version", ["v1", "v2"])
def test_containers_translate_with_their_steps_and_weights(version) -> None:
    T = api(version)
    steps = to_steps([T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                      T.RandomChoice([T.RandomHorizontalFlip(), T.Pad(2)], p=[1, 3]), T.CenterCrop(8)]).steps
    assert steps[0] == RandomApply((ColorJitter((0.6, 1.4), (0.6, 1.4), (0.6, 1.4), (-0.1, 0.1)),), 0.8)
    assert steps[1].transforms == (RandomHorizontalFlip(0.5), Pad(2))
    assert RandomChoice(steps[1].transforms, steps[1].p).weights() == [0.25, 0.75]  # v2 keeps p normalized
    with pytest.raises(ValueError, match=r"transform\[0\]: RandomApply with a type conversion .* inside"):
        to_steps([T.RandomApply([T.ToTensor() if version == "v1" else T.ToDtype(torch.float32, scale=True)])])


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_random_order_translates_each_branch(version) -> None:
    T = api(version)
    steps = to_steps([T.RandomOrder([T.RandomHorizontalFlip(1.0), T.Compose([T.Pad(1), T.CenterCrop(8)])]),
                      T.CenterCrop(8)]).steps
    assert steps[0] == RandomOrder((RandomHorizontalFlip(1.0), RandomApply((Pad(1), CenterCrop((8, 8))), 1.0)))


def test_simclr_colour_recipe_equals_torchvision_on_the_drawn_parameters(folder) -> None:
    """RandomApply([ColorJitter], p=0.8) then RandomGrayscale(0.2) on uint8 tensors, as SimCLR's recipe."""
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from torchvision.datasets import ImageFolder

    jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    recipe = T.Compose([T.CenterCrop(20), T.PILToTensor(), T.RandomApply([jitter], p=0.8), T.RandomGrayscale(0.2)])
    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=recipe, seed=21, num_threads=1, columns=["index"])
    ours = to_steps(recipe).steps[1]
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    applied = 0
    for images, _labels, extra in loader:
        for image, index in zip(images, extra["index"].tolist(), strict=True):
            pil, _ = plain[index]
            ref = F.pil_to_tensor(F.center_crop(pil, [20, 20]))
            rng = SampleRandom(21, 0, index)
            params, _ = ours.draw(rng, (20, 20))
            if params["apply"]:
                for op in params["0.order"]:
                    if op >= 0:
                        ref = adjust[op](ref, float(params["0.factors"][op]))
                applied += 1
            if rng.random() < 0.2:
                ref = F.rgb_to_grayscale(ref, 3)
            # ColorJitter's stated bound: within one level of torchvision's uint8 tensor arithmetic (hue's round trip).
            assert (image.int() - ref.int()).abs().max() <= 1, f"sample {index}"
    assert 0 < applied < 12


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_geometric_choice_equals_torchvision_exactly(folder, version) -> None:
    import torchvision.transforms.functional as F
    from torchvision.datasets import ImageFolder

    T = api(version)
    recipe = T.Compose([T.RandomChoice([T.RandomHorizontalFlip(1.0), T.RandomCrop(22, padding=3),
                                        T.Resize((22, 22), interpolation=T.InterpolationMode.BICUBIC)], p=[1, 1, 2]),
                        T.CenterCrop(22), T.PILToTensor() if version == "v1" else T.ToImage()])
    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=recipe, seed=4, num_threads=1, columns=["index"])
    choice = to_steps(recipe).steps[0]
    for images, _labels, extra in loader:
        for image, index in zip(images, extra["index"].tolist(), strict=True):
            pil, _ = plain[index]
            rng = SampleRandom(4, 0, index)
            k = choice.choose(rng)
            choice.transforms[0].draw(rng, (pil.height, pil.width))
            top, left = choice.transforms[1].window(rng, pil.height, pil.width)
            ref = [F.hflip(pil), F.crop(F.pad(pil, 3), top, left, 22, 22),
                   F.resize(pil, [22, 22], T.InterpolationMode.BICUBIC)][k]
            assert torch.equal(image, F.pil_to_tensor(F.center_crop(ref, [22, 22]))), f"sample {index} branch {k}"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_draws_match_torchvision_by_ks(version) -> None:
    """Which branch each of many samples takes, from torchvision's own containers and from ours."""
    T = api(version)
    n = 4000
    torch.manual_seed(0)
    import random

    random.seed(0)  # v1's RandomChoice draws with Python's random.choices
    mark = [T.Lambda(lambda x, k=k: x * 0 + k) for k in range(3)]
    x = torch.zeros(1)
    theirs_apply = np.array([float(T.RandomApply([mark[1]], p=0.7)(x)) for _ in range(n)])
    theirs_choice = np.array([float(T.RandomChoice(mark, p=[0.2, 0.3, 0.5])(x)) for _ in range(n)])
    apply = RandomApply([RandomHorizontalFlip(1.0)], p=0.7)
    ours_apply = np.array([float(apply.draw(SampleRandom(0, 0, i), (4, 4))[0]["apply"]) for i in range(n)])
    choice = RandomChoice([RandomHorizontalFlip(1.0)] * 3, p=[0.2, 0.3, 0.5])
    ours_choice = np.array([choice.choose(SampleRandom(0, 1, i)) for i in range(n)], float)
    bound = 1.95 * np.sqrt(2 / n)  # the two-sample statistic's 0.001 critical value
    assert ks_statistic(ours_apply, theirs_apply) < bound
    assert ks_statistic(ours_choice, theirs_choice) < bound
    # RandomOrder: each of the 6 orders of 3 steps, read off as the digits the steps append in turn.
    append = [T.Lambda(lambda x, k=k: x * 10 + k) for k in range(3)]
    theirs_order = np.array([float(T.RandomOrder(append)(torch.zeros(1, dtype=torch.float64))) for _ in range(n)])
    order = RandomOrder([RandomHorizontalFlip(1.0)] * 3)
    ours_order = np.array([float("".join(map(str, order.draw(SampleRandom(0, 2, i), (4, 4))[0]["order"])))
                           for i in range(n)])
    assert set(ours_order) == set(theirs_order) and len(set(ours_order)) == 6
    assert ks_statistic(ours_order, theirs_order) < bound
