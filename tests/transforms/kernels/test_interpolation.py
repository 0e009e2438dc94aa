"""PIL's BICUBIC, NEAREST, BOX, HAMMING and LANCZOS resizes, in the kernels and the CPU graph, against PIL (exact)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize
from stallfree.transforms.kernels.filters import FILTERS
from stallfree.transforms.kernels.resample import resample_normalize
from stallfree.transforms.ops.resize import nearest_table
from stallfree.transforms.random import SampleRandom

PIL_FILTERS = {"bicubic": Image.Resampling.BICUBIC, "nearest": Image.Resampling.NEAREST, "box": Image.Resampling.BOX,
               "hamming": Image.Resampling.HAMMING, "lanczos": Image.Resampling.LANCZOS,
               "bilinear": Image.Resampling.BILINEAR}


def _image(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    if rng.random() < 0.5:
        return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    y, x = np.mgrid[0:h, 0:w]
    smooth = np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (h + w)], -1)
    return np.clip(smooth + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bicubic", "box", "hamming", "lanczos", "bilinear"])
def test_each_filter_of_the_kernel_equals_pils(mode) -> None:
    rng = np.random.default_rng(1)
    flags = np.array([0, 0, 0, 1, 1, 1, 1, 0, FILTERS[mode]], np.float32)  # mean 0, std 1, antialias, HWC, filter
    for _ in range(150):
        h, w = (int(v) for v in rng.integers(2, 70, 2))
        oh, ow = (int(v) for v in rng.integers(1, 110, 2))
        image = _image(rng, h, w)
        out = np.empty((oh, ow, 3), np.float32)
        resample_normalize(out, image, flags, False)
        ref = np.asarray(Image.fromarray(image).resize((ow, oh), PIL_FILTERS[mode]))
        np.testing.assert_array_equal(out, ref, err_msg=f"{(h, w)} -> {(oh, ow)}")


def test_nearest_table_equals_pil_nearest() -> None:
    rng = np.random.default_rng(2)
    for _ in range(500):
        h, w = (int(v) for v in rng.integers(1, 200, 2))
        oh, ow = (int(v) for v in rng.integers(1, 200, 2))
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        ref = np.asarray(Image.fromarray(image).resize((ow, oh), Image.Resampling.NEAREST))
        assert np.array_equal(image[nearest_table(h, oh)][:, nearest_table(w, ow)], ref), f"{(h, w)} -> {(oh, ow)}"


@pytest.fixture(scope="module")
def pngs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    root = tmp_path_factory.mktemp("pngs")
    rng = np.random.default_rng(3)
    images, lines = [], ["path,label"]
    for i, (h, w) in enumerate([(30, 40), (41, 23), (64, 64), (17, 50)]):
        pixels = _image(rng, h, w)
        Image.fromarray(pixels).save(root / f"{i}.png")
        images.append(pixels)
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines))
    return root / "list.csv", images


def run(source: Path, transform: list, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    loader = Loader(source, batch_size=4, transform=transform, shuffle=False, num_threads=1, **kwargs)
    ((images, labels),) = list(loader)
    return images, labels


def pil_resize(image: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    return np.asarray(Image.fromarray(image).resize(size[::-1], PIL_FILTERS[mode]))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bicubic", "nearest", "box", "hamming", "lanczos"])
def test_resize_in_the_graph_equals_pil(pngs, mode) -> None:
    source, originals = pngs
    resize = Resize(27, interpolation=mode)
    images, labels = run(source, [resize, CenterCrop(24)], dtype="uint8", layout="NHWC")
    for image, label in zip(images, labels.tolist(), strict=True):
        src = originals[label]
        ref = pil_resize(src, resize.output_size(*src.shape[:2]), mode)
        top, left = int(round((ref.shape[0] - 24) / 2.0)), int(round((ref.shape[1] - 24) / 2.0))
        assert np.array_equal(image.numpy(), ref[top : top + 24, left : left + 24]), f"sample {label}"


@pytest.mark.parametrize("mode", ["bicubic", "nearest"])
@pytest.mark.parametrize("first", [True, False])
def test_random_resized_crop_in_the_graph_equals_pil(pngs, mode, first) -> None:
    """First: the window is decoded alone (region of interest); later: the step crops the decoded image."""
    source, originals = pngs
    rrc = RandomResizedCrop((20, 22), scale=(0.3, 1.0), interpolation=mode)
    steps = [rrc] if first else [CenterCrop(16), rrc]
    images, labels = run(source, steps, dtype="uint8", layout="NHWC", seed=6)
    for image, label in zip(images, labels.tolist(), strict=True):
        src = originals[label]
        if not first:
            center = CenterCrop(16)
            top, left = center.anchor(*src.shape[:2])
            padded = np.zeros((max(16, src.shape[0]), max(16, src.shape[1]), 3), np.uint8)
            pt, pl = max(0, -top), max(0, -left)
            padded[pt : pt + src.shape[0], pl : pl + src.shape[1]] = src
            src = padded[max(top, 0) : max(top, 0) + 16, max(left, 0) : max(left, 0) + 16]
        top, left, h, w = rrc.window(SampleRandom(6, 0, label), *src.shape[:2])
        ref = pil_resize(src[top : top + h, left : left + w], (20, 22), mode)
        assert np.array_equal(image.numpy(), ref), f"sample {label}"


@pytest.mark.parametrize("mode", ["bicubic", "nearest"])
def test_fused_output_of_each_mode_equals_the_uint8_graph_normalized(pngs, mode) -> None:
    # [Resize, flip, Normalize] ends in the resampler writing floats (bicubic) or a gather then the output op.
    source, _ = pngs
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    raw, _ = run(source, [Resize((21, 19), interpolation=mode), RandomHorizontalFlip(1.0)], dtype="uint8")
    images, _ = run(source, [Resize((21, 19), interpolation=mode), RandomHorizontalFlip(1.0), Normalize(mean, std)])
    expected = (raw.float() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    torch.testing.assert_close(images, expected, atol=1e-5, rtol=1e-5)


def test_other_interpolations_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"Resize: interpolation must be one of \('bilinear', 'bicubic', 'nearest', "
                                         r"'box', 'hamming', 'lanczos'\)"):
        Resize(8, interpolation="area")  # type: ignore[arg-type]
