"""torchvision's geometric recipes through the Loader against torchvision itself on the same PIL images.

Each sample is compared with torchvision's functional ops run on the parameters stallfree drew from the sample's
keyed stream (``SampleRandom(seed, epoch, index)``); the draws themselves are compared with torchvision's own by a
two-sample Kolmogorov-Smirnov test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ks import ks_statistic
from PIL import Image

from stallfree import Loader
from stallfree.transforms import RandomResizedCrop
from stallfree.transforms.ops.geometry import RandomCrop, RandomZoomOut
from stallfree.transforms.random import SampleRandom

pytestmark = pytest.mark.torchvision


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(8)
    for i in range(8):
        h, w = int(rng.integers(24, 40)), int(rng.integers(24, 40))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        (root / f"class{i % 2}").mkdir(exist_ok=True)
        Image.fromarray(pixels).save(root / f"class{i % 2}" / f"{i:02d}.png")
    return root


def api(version: str):
    if version == "v1":
        import torchvision.transforms as T
    else:
        import torchvision.transforms.v2 as T
    return T



def ks_bound(n: int, m: int) -> float:
    """The statistic's 0.001 critical value (1.95 sqrt((n + m) / (n m))); conservative for discrete draws."""
    return 1.95 * float(np.sqrt((n + m) / (n * m)))


def pixels_of(loader: Loader) -> list[tuple[int, np.ndarray]]:
    out = []
    for images, _labels, extra in loader:
        for image, index in zip(images, extra["index"].tolist(), strict=True):
            out.append((index, image.numpy()))
    return out


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_random_crop_equals_torchvision_on_the_drawn_window(folder, version, mode) -> None:
    import torchvision.transforms.functional as F
    from torchvision.datasets import ImageFolder

    T = api(version)
    fill = (9, 99, 199)
    recipe = T.Compose([T.RandomCrop(36, padding=(4, 2), pad_if_needed=True, fill=fill, padding_mode=mode),
                        T.PILToTensor() if version == "v1" else T.ToImage()])
    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=recipe, seed=3, num_threads=1, layout="NHWC", columns=["index"])
    ours = RandomCrop(36, padding=(4, 2), pad_if_needed=True, fill=fill, padding_mode=mode,
                      v1_padding=version == "v1")
    for index, image in pixels_of(loader):
        pil, _ = plain[index]
        if version == "v1":  # pads, then pads the padded image by the shortfall
            ref = F.pad(pil, [4, 2], fill=fill, padding_mode=mode)
            if ref.width < 36:
                ref = F.pad(ref, [36 - ref.width, 0], fill=fill, padding_mode=mode)
            if ref.height < 36:
                ref = F.pad(ref, [0, 36 - ref.height], fill=fill, padding_mode=mode)
        else:  # pads once, by the padding plus the shortfall
            short_w, short_h = max(0, 36 - pil.width - 8), max(0, 36 - pil.height - 4)
            ref = F.pad(pil, [4 + short_w, 2 + short_h], fill=fill, padding_mode=mode)
        top, left = ours.window(SampleRandom(3, 0, index), pil.height, pil.width)
        expected = np.asarray(F.crop(ref, top, left, 36, 36))
        assert np.array_equal(image, expected), f"sample {index} window {(top, left)}"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cifar_recipe_equals_torchvision(folder, version) -> None:
    import torchvision.transforms.functional as F
    from torchvision.datasets import ImageFolder

    T = api(version)
    mean, std = (0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261)
    to_tensor = [T.ToTensor()] if version == "v1" else [T.ToImage(), T.ToDtype(torch.float32, scale=True)]
    recipe = T.Compose([T.RandomCrop(24, padding=4), T.RandomHorizontalFlip(), *to_tensor, T.Normalize(mean, std)])
    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=recipe, seed=5, num_threads=1, columns=["index"])
    crop = RandomCrop(24, padding=4)
    for index, image in pixels_of(loader):
        pil, _ = plain[index]
        rng = SampleRandom(5, 0, index)
        top, left = crop.window(rng, pil.height, pil.width)
        ref = F.crop(F.pad(pil, 4), top, left, 24, 24)
        if rng.random() < 0.5:
            ref = F.hflip(ref)
        expected = F.normalize(F.to_tensor(ref), mean, std).numpy()
        np.testing.assert_allclose(image, expected, atol=1e-5, err_msg=f"sample {index}")


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_random_crop_draws_match_torchvision_by_ks(version) -> None:
    T = api(version)
    n = 3000
    torch.manual_seed(0)
    theirs = []
    pil = Image.new("RGB", (30, 20))
    for _ in range(n):
        if version == "v1":
            top, left, _, _ = T.RandomCrop.get_params(T.functional.pad(pil, 4), (16, 16))
        else:
            params = T.RandomCrop(16, padding=4).make_params([pil])
            top, left = params["top"], params["left"]
        theirs.append((top, left))
    ours = [RandomCrop(16, padding=4).window(SampleRandom(1, 0, i), 20, 30) for i in range(n)]
    for axis in (0, 1):
        a, b = np.array([o[axis] for o in ours]), np.array([t[axis] for t in theirs])
        assert ks_statistic(a, b) < ks_bound(n, n), f"axis {axis}"


def test_pad_translates_with_per_channel_fill_and_mode(folder) -> None:
    import torchvision.transforms as T
    import torchvision.transforms.v2 as V
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    for M in (T, V):
        for mode in ("constant", "edge", "reflect", "symmetric"):
            recipe = M.Compose([M.Pad([3, 1, 2, 5], fill=(5, 6, 7), padding_mode=mode), M.CenterCrop(30),
                                M.PILToTensor() if M is T else M.ToImage()])
            dataset = ImageFolder(folder, transform=recipe)
            (got, _), = list(Loader(dataset, batch_size=8, shuffle=False, num_threads=1))
            (ref, _), = list(DataLoader(dataset, batch_size=8, shuffle=False))
            assert torch.equal(got, ref), (M.__name__, mode)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("mode", ["BICUBIC", "NEAREST", "LANCZOS", "BOX", "HAMMING"])
def test_eval_recipe_with_bicubic_or_nearest_equals_the_dataloader(folder, version, mode) -> None:
    """The timm/ViT evaluation recipe: PIL's BICUBIC (or another filter) resize, a centre crop, normalized floats."""
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    T = api(version)
    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    to_tensor = [T.ToTensor()] if version == "v1" else [T.ToImage(), T.ToDtype(torch.float32, scale=True)]
    recipe = T.Compose([T.Resize(30, interpolation=getattr(T.InterpolationMode, mode)), T.CenterCrop(26),
                        *to_tensor, T.Normalize(mean, std)])
    dataset = ImageFolder(folder, transform=recipe)
    (got, _), *_ = list(Loader(dataset, batch_size=8, shuffle=False, num_threads=1))
    (ref, _), *_ = list(DataLoader(dataset, batch_size=8, shuffle=False))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)  # the same uint8 levels, normalized


@pytest.mark.parametrize("mode", ["BICUBIC", "NEAREST"])
def test_random_resized_crop_with_bicubic_or_nearest_equals_torchvision(folder, mode) -> None:
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from torchvision.datasets import ImageFolder

    interpolation = getattr(T.InterpolationMode, mode)
    recipe = T.Compose([T.RandomResizedCrop(20, scale=(0.2, 1.0), interpolation=interpolation), T.PILToTensor()])
    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=recipe, seed=2, num_threads=1, layout="NHWC", columns=["index"])
    rrc = RandomResizedCrop(20, scale=(0.2, 1.0))
    for index, image in pixels_of(loader):
        pil, _ = plain[index]
        top, left, h, w = rrc.window(SampleRandom(2, 0, index), pil.height, pil.width)
        expected = np.asarray(F.resized_crop(pil, top, left, h, w, [20, 20], interpolation))
        assert np.array_equal(image, expected), f"sample {index}"


def test_zoom_out_equals_torchvision_on_the_drawn_canvas(folder) -> None:
    import torchvision.transforms.v2 as T
    import torchvision.transforms.v2.functional as F
    from torchvision.datasets import ImageFolder

    recipe = T.Compose([T.RandomZoomOut(fill=(10, 20, 30), side_range=(1.0, 2.5), p=0.7), T.CenterCrop(60),
                        T.ToImage()])
    ours = RandomZoomOut((10, 20, 30), (1.0, 2.5), 0.7)
    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=recipe, seed=6, num_threads=1, layout="NHWC", columns=["index"])
    zoomed = 0
    for index, image in pixels_of(loader):
        pil, _ = plain[index]
        padding = list(ours.padding(SampleRandom(6, 0, index), pil.height, pil.width))
        zoomed += any(padding)
        expected = np.asarray(F.center_crop(F.pad(pil, padding, fill=[10, 20, 30]), [60, 60]))
        assert np.array_equal(image, expected), f"sample {index} padding {padding}"
    assert 0 < zoomed < 8


def test_zoom_out_canvas_is_torchvisions_float32_arithmetic() -> None:
    import torchvision.transforms.v2 as T

    theirs, ours = T.RandomZoomOut(side_range=(1.0, 4.0), p=1.0), RandomZoomOut(side_range=(1.0, 4.0), p=1.0)
    n = 3000
    torch.manual_seed(0)
    pil = Image.new("RGB", (37, 23))
    theirs_pads = np.array([theirs.make_params([pil])["padding"] for _ in range(n)], float)
    ours_pads = np.array([ours.padding(SampleRandom(0, 0, i), 23, 37) for i in range(n)], float)
    for k in range(4):
        assert ks_statistic(ours_pads[:, k], theirs_pads[:, k]) < ks_bound(n, n), f"padding {k}"
    for i in range(500):  # the same uniforms through torch's float32 give the same canvas and place
        rng = SampleRandom(0, 1, i)
        stream = [rng.random() for _ in range(4)]  # p's draw, the scale's, then the place's two
        r = 1.0 + torch.tensor([stream[1]], dtype=torch.float32) * (4.0 - 1.0)
        canvas_w, canvas_h = int(37 * r), int(23 * r)
        left = int((canvas_w - 37) * torch.tensor(stream[2], dtype=torch.float32))
        top = int((canvas_h - 23) * torch.tensor(stream[3], dtype=torch.float32))
        expected = (left, top, canvas_w - left - 37, canvas_h - top - 23)
        assert ours.padding(SampleRandom(0, 1, i), 23, 37) == expected
