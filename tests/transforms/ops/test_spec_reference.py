"""Each built-in transform inside the running DALI CPU graph against a NumPy/PIL reference of its definition."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize
from stallfree.transforms.random import SampleRandom


@pytest.fixture(scope="module")
def pngs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    """Smooth PNG images (lossless, so decoded pixels are exact) of several sizes, label = index."""
    root = tmp_path_factory.mktemp("pngs")
    images, lines = [], ["path,label"]
    for i, (h, w) in enumerate([(30, 40), (41, 23), (64, 64), (17, 50)]):
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (h + w)], -1).astype(np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.png")
        images.append(pixels)
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines))
    return root / "list.csv", images


def run(source: Path, transform: list, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    loader = Loader(source, batch_size=4, transform=transform, shuffle=False, num_threads=1, **kwargs)
    ((images, labels),) = list(loader)
    return images, labels


@pytest.mark.parametrize("size", [(16, 16), (20, 30), (70, 45)])
def test_center_crop_matches_numpy_with_torchvision_padding(pngs, size) -> None:
    source, originals = pngs
    images, labels = run(source, [CenterCrop(size)], dtype="uint8", layout="NHWC")
    ch, cw = size
    for img, label in zip(images, labels, strict=True):
        src = originals[int(label)]
        h, w = src.shape[:2]
        pad_t, pad_l = max(0, (ch - h) // 2), max(0, (cw - w) // 2)
        padded = np.zeros((max(h, ch), max(w, cw), 3), np.uint8)
        padded[pad_t : pad_t + h, pad_l : pad_l + w] = src
        top = int(round((padded.shape[0] - ch) / 2.0))
        left = int(round((padded.shape[1] - cw) / 2.0))
        assert np.array_equal(img.numpy(), padded[top : top + ch, left : left + cw])


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_flip_is_an_exact_mirror(pngs, p) -> None:
    source, originals = pngs
    images, labels = run(source, [CenterCrop(16), RandomHorizontalFlip(p)], dtype="uint8", layout="NHWC")
    plain, _ = run(source, [CenterCrop(16)], dtype="uint8", layout="NHWC")
    expected = plain.flip(2) if p == 1.0 else plain
    assert torch.equal(images, expected)


def test_flip_in_the_middle_of_the_chain(pngs) -> None:
    source, _ = pngs
    images, _ = run(source, [CenterCrop(16), RandomHorizontalFlip(1.0), CenterCrop(8)], dtype="uint8", layout="NHWC")
    plain, _ = run(source, [CenterCrop(16)], dtype="uint8", layout="NHWC")
    assert torch.equal(images, plain.flip(2)[:, 4:12, 4:12])


def test_normalize_matches_definition(pngs) -> None:
    source, _ = pngs
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    raw, _ = run(source, [CenterCrop(16)], dtype="uint8")
    images, _ = run(source, [CenterCrop(16), Normalize(mean, std)])
    expected = (raw.float() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    torch.testing.assert_close(images, expected, atol=1e-5, rtol=1e-5)


def test_float_without_normalize_is_scaled_like_to_tensor(pngs) -> None:
    source, _ = pngs
    raw, _ = run(source, [CenterCrop(16)], dtype="uint8")
    scaled, _ = run(source, [CenterCrop(16)], dtype="float32")
    torch.testing.assert_close(scaled, raw.float() / 255, atol=1e-6, rtol=0)


def test_resize_shorter_side_matches_pil_bilinear(pngs) -> None:
    source, originals = pngs
    resize = Resize(12)
    images, labels = run(source, [resize, CenterCrop(12)], dtype="uint8", layout="NHWC")
    for img, label in zip(images, labels, strict=True):
        src = originals[int(label)]
        oh, ow = resize.output_size(*src.shape[:2])
        ref = np.asarray(Image.fromarray(src).resize((ow, oh), Image.Resampling.BILINEAR), np.int16)
        top, left = int(round((oh - 12) / 2.0)), int(round((ow - 12) / 2.0))
        diff = np.abs(img.numpy().astype(np.int16) - ref[top : top + 12, left : left + 12])
        assert diff.max() <= 1  # PIL's own filter in fixed point (transforms/kernels/resample.py)


@pytest.mark.parametrize("resize", [Resize((9, 13)), Resize(10, max_size=20), Resize(12, antialias=False)])
def test_every_resize_form_matches_pil_bilinear(pngs, resize) -> None:
    # Fixed and shorter-side sizes take different set-up paths in the graph; both must agree with the host's sizes.
    source, originals = pngs
    images, labels = run(source, [resize, CenterCrop(5)], dtype="uint8", layout="NHWC")
    for img, label in zip(images, labels, strict=True):
        src = originals[int(label)]
        oh, ow = resize.output_size(*src.shape[:2])
        if resize.antialias:
            ref = np.asarray(Image.fromarray(src).resize((ow, oh), Image.Resampling.BILINEAR), np.int16)
        else:  # torch's bilinear without antialiasing, on the float image
            t = torch.from_numpy(src).permute(2, 0, 1)[None].double()
            t = torch.nn.functional.interpolate(t, size=(oh, ow), mode="bilinear", align_corners=False)
            ref = t[0].permute(1, 2, 0).round().clamp(0, 255).numpy().astype(np.int16)
        top, left = int(round((oh - 5) / 2.0)), int(round((ow - 5) / 2.0))
        diff = np.abs(img.numpy().astype(np.int16) - ref[top : top + 5, left : left + 5])
        assert diff.max() <= 1, f"sample {int(label)} resized to {(oh, ow)}"


def test_resize_of_a_float_image_matches_pil_bilinear(pngs) -> None:
    # After Normalize the image is float, which DALI's own resize handles (the Numba resampler takes uint8).
    source, originals = pngs
    images, labels = run(source, [Normalize((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)), Resize((9, 13))], layout="NHWC")
    for img, label in zip(images, labels, strict=True):
        ref = np.asarray(Image.fromarray(originals[int(label)]).resize((13, 9), Image.Resampling.BILINEAR))
        assert np.abs(img.numpy() * 255 - ref).max() <= 3, f"sample {int(label)}"


def test_random_resized_crop_after_a_resize_crops_then_resizes(pngs) -> None:
    # Not the first step, so the window is cut from decoded pixels in the graph (no region-of-interest decode).
    source, originals = pngs
    rrc = RandomResizedCrop(10, scale=(0.3, 1.0))
    loader = Loader(source, batch_size=4, transform=[Resize((32, 36)), rrc], shuffle=False, num_threads=1,
                    dtype="uint8", layout="NHWC", seed=5)
    ((images, labels),) = list(loader)
    for img, label in zip(images, labels, strict=True):
        resized = Image.fromarray(originals[int(label)]).resize((36, 32), Image.Resampling.BILINEAR)
        top, left, h, w = rrc.window(SampleRandom(5, 0, int(label)), 32, 36)
        ref = np.asarray(resized.crop((left, top, left + w, top + h)).resize((10, 10), Image.Resampling.BILINEAR))
        diff = np.abs(img.numpy().astype(np.int16) - ref.astype(np.int16))
        assert diff.max() <= 2, f"sample {int(label)} window {(top, left, h, w)}"  # two resizes, each within 1


def test_resize_output_size_follows_torchvision() -> None:
    assert Resize(10).output_size(30, 45) == (10, 15)
    assert Resize(10).output_size(47, 20) == (23, 10)
    assert Resize(10, max_size=12).output_size(30, 45) == (8, 12)
    assert Resize((5, 7)).output_size(30, 45) == (5, 7)


def test_random_resized_crop_window_and_pixels(pngs) -> None:
    source, originals = pngs
    rrc = RandomResizedCrop(10, scale=(0.3, 1.0))
    loader = Loader(source, batch_size=4, transform=[rrc], shuffle=False, num_threads=1, dtype="uint8",
                    layout="NHWC", seed=11)
    ((images, labels),) = list(loader)
    for img, label in zip(images, labels, strict=True):
        src = originals[int(label)]
        top, left, h, w = rrc.window(SampleRandom(11, 0, int(label)), *src.shape[:2])
        assert 0 <= top and top + h <= src.shape[0] and 0 <= left and left + w <= src.shape[1]
        crop = Image.fromarray(src[top : top + h, left : left + w])
        ref = np.asarray(crop.resize((10, 10), Image.Resampling.BILINEAR), np.int16)
        diff = np.abs(img.numpy().astype(np.int16) - ref)
        assert diff.max() <= 1, f"sample {int(label)} window {(top, left, h, w)}"


def test_random_resized_crop_window_statistics() -> None:
    # With scale <= 0.5 on a square image every first attempt fits, so area and log-ratio are plain uniforms.
    rrc = RandomResizedCrop(8, scale=(0.08, 0.5))
    areas, ratios = [], []
    for sample in range(2000):
        top, left, h, w = rrc.window(SampleRandom(0, 0, sample), 1000, 1000)
        assert 0 <= top <= 1000 - h and 0 <= left <= 1000 - w
        areas.append(h * w / 1e6)
        ratios.append(w / h)
    assert 0.075 <= min(areas) and max(areas) <= 0.505
    assert float(np.mean(areas)) == pytest.approx(0.29, abs=0.01)
    assert float(np.mean(np.log(ratios))) == pytest.approx(0.0, abs=0.01)
    assert 0.74 < min(ratios) and max(ratios) < 1.34


def test_random_resized_crop_falls_back_to_center_crop() -> None:
    # A 1x100 strip cannot hold any window with ratio in [3/4, 4/3]: torchvision centre-crops at the max ratio.
    assert RandomResizedCrop(8).window(SampleRandom(0, 0, 0), 1, 100) == (0, 49, 1, 1)
    assert RandomResizedCrop(8, scale=(1.0, 1.0), ratio=(1.0, 1.0)).window(SampleRandom(0, 0, 0), 10, 20) == (
        0, 5, 10, 10)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: RandomResizedCrop(-1), "size must be positive"),
        (lambda: RandomResizedCrop(8, scale=(0.9, 0.1)), "scale"),
        (lambda: Resize("big"), "size must be an int"),
        (lambda: CenterCrop((0, 3)), "size must be positive"),
        (lambda: RandomHorizontalFlip(1.5), "p must be in"),
        (lambda: Normalize((0.5, 0.5), (0.2, 0.2)), "1 or 3 values"),
        (lambda: Normalize(std=(0.2, 0.0, 0.1)), "std must be positive"),
    ],
)
def test_bad_transform_arguments(factory, match) -> None:
    with pytest.raises(ValueError, match=match):
        factory()
