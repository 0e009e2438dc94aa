"""Grayscale output: `channels=1` and `Grayscale(num_output_channels)` give PIL's convert("L") luma."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.transforms import CenterCrop, Grayscale, Normalize, RandomResizedCrop


@pytest.fixture(scope="module")
def colour(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    root = tmp_path_factory.mktemp("colour")
    rng = np.random.default_rng(7)
    images, lines = [], ["path,label"]
    for i in range(4):
        pixels = rng.integers(0, 256, (20, 26, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.png")
        images.append(pixels)
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return root / "list.csv", images


def run(source: Path, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    ((images, labels),) = list(Loader(source, batch_size=4, shuffle=False, num_threads=1, **kwargs))
    return images, labels


def pil_luma(pixels: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(pixels).convert("L"))


def test_channels_1_is_pil_luma_exactly(colour) -> None:
    source, originals = colour
    images, labels = run(source, transform=CenterCrop(16), channels=1, dtype="uint8")
    assert images.shape == (4, 1, 16, 16)
    for image, label in zip(images, labels, strict=True):
        expected = pil_luma(originals[int(label)])[2:18, 5:21]
        assert np.array_equal(image[0].numpy(), expected)


def test_grayscale_step_3_channels_and_nhwc(colour) -> None:
    source, originals = colour
    three, labels = run(source, transform=[CenterCrop(16), Grayscale(3)], dtype="uint8", layout="NHWC")
    one, _ = run(source, transform=[CenterCrop(16), Grayscale(1)], dtype="uint8", layout="NHWC")
    assert three.shape == (4, 16, 16, 3) and one.shape == (4, 16, 16, 1)
    assert torch.equal(three, one.expand(-1, -1, -1, 3))


def test_grayscale_then_one_value_normalize(colour) -> None:
    source, _ = colour
    raw, _ = run(source, transform=CenterCrop(16), channels=1, dtype="uint8")
    images, _ = run(source, transform=[CenterCrop(16), Grayscale(1), Normalize((0.5,), (0.25,))])
    torch.testing.assert_close(images, (raw.float() / 255 - 0.5) / 0.25, atol=1e-5, rtol=0)


def test_channels_1_keeps_region_of_interest_decoding(colour) -> None:
    source, _ = colour
    loader = Loader(source, batch_size=4, transform=RandomResizedCrop(8), channels=1)
    assert loader.compiled.roi_decode and isinstance(loader.compiled.steps[1], Grayscale)


def test_bad_channel_counts() -> None:
    with pytest.raises(ValueError, match="num_output_channels should be either 1 or 3, got 2"):
        Grayscale(2)


def test_loader_channels_is_1_or_3(colour) -> None:
    with pytest.raises(ValueError, match="channels must be 1 \\(grayscale\\) or 3 \\(RGB\\), got 2"):
        Loader(colour[0], batch_size=4, transform=CenterCrop(8), channels=2)
