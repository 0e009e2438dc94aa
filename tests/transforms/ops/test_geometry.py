"""Pad and RandomCrop inside the running DALI CPU graph against np.pad and the drawn windows (no torchvision)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.transforms.ops.geometry import Pad, RandomCrop, RandomZoomOut, padding_table
from stallfree.transforms.random import SampleRandom

SIZES = [(30, 40), (41, 23), (17, 50), (32, 32)]


@pytest.fixture(scope="module")
def noise(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    """Noise PNGs (every pixel differs from its neighbours, so a wrong index shows), label = index."""
    root = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(5)
    images, lines = [], ["path,label"]
    for i, (h, w) in enumerate(SIZES):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.png")
        images.append(pixels)
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines))
    return root / "list.csv", images


def run(source: Path, transform: list, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    loader = Loader(source, batch_size=4, transform=transform, shuffle=False, num_threads=1, dtype="uint8",
                    layout="NHWC", **kwargs)
    ((images, labels),) = list(loader)
    return images, labels


def padded(src: np.ndarray, left: int, top: int, right: int, bottom: int, mode: str, fill=(0, 0, 0)) -> np.ndarray:
    """torchvision's pad of a PIL image: np.pad, or the fill colour where mode is constant."""
    if mode != "constant":
        return np.pad(src, ((top, bottom), (left, right), (0, 0)), mode=mode)
    out = np.empty((src.shape[0] + top + bottom, src.shape[1] + left + right, 3), np.uint8)
    out[:] = np.asarray(fill, np.uint8)
    out[top : top + src.shape[0], left : left + src.shape[1]] = src
    return out


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric"])
def test_pad_then_center_crop_equals_np_pad(noise, mode) -> None:
    source, originals = noise
    fill = (10, 200, 30)
    images, labels = run(source, [Pad((3, 5, 7, 2), fill=fill, padding_mode=mode), RandomCrop(12)], seed=4)
    for image, label in zip(images, labels.tolist(), strict=True):
        src = originals[label]
        ref = padded(src, 3, 5, 7, 2, mode, fill)
        rng = SampleRandom(4, 0, label)
        crop = RandomCrop(12)
        top, left = crop.window(rng, *ref.shape[:2])
        assert np.array_equal(image.numpy(), ref[top : top + 12, left : left + 12]), f"sample {label}"


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_random_crop_with_padding_and_pad_if_needed(noise, mode) -> None:
    source, originals = noise
    crop = RandomCrop((36, 44), padding=(1, 2), pad_if_needed=True, fill=7, padding_mode=mode)
    images, labels = run(source, [crop], seed=11)
    for image, label in zip(images, labels.tolist(), strict=True):
        src = originals[label]
        h, w = src.shape[:2]
        # torchvision: pad, then pad both sides of a short dimension by the shortfall, then crop.
        extra_w, extra_h = max(0, 44 - (w + 2)), max(0, 36 - (h + 4))
        ref = padded(src, 1 + extra_w, 2 + extra_h, 1 + extra_w, 2 + extra_h, mode, (7, 7, 7))
        top, left = crop.window(SampleRandom(11, 0, label), h, w)
        assert np.array_equal(image.numpy(), ref[top : top + 36, left : left + 44]), f"sample {label}"


def test_pad_alone_gives_each_sample_its_padded_size(noise) -> None:
    source, originals = noise
    loader = Loader(source, batch_size=1, transform=[Pad(2, padding_mode="symmetric"), RandomCrop(8)],
                    shuffle=False, num_threads=1, dtype="uint8", layout="NHWC")
    assert [tuple(x.shape) for x, _ in loader] == [(1, 8, 8, 3)] * 4
    assert Pad(2).draw(SampleRandom(0, 0, 0), (30, 40))[1] == (34, 44)


def test_zoom_out_places_the_image_on_a_filled_canvas(noise) -> None:
    source, originals = noise
    zoom = RandomZoomOut(fill=(1, 2, 3), side_range=(1.2, 2.0), p=1.0)
    images, labels = run(source, [zoom, RandomCrop(44, pad_if_needed=True, fill=(1, 2, 3))], seed=2)
    for image, label in zip(images, labels.tolist(), strict=True):
        src = originals[label]
        rng = SampleRandom(2, 0, label)
        left, top, right, bottom = zoom.padding(rng, *src.shape[:2])
        canvas = padded(src, left, top, right, bottom, "constant", (1, 2, 3))
        crop = RandomCrop(44, pad_if_needed=True)
        rows, cols = crop.stages(*canvas.shape[:2])
        (top_pad, bottom_pad), (left_pad, right_pad) = rows[0], cols[0]
        ref = padded(canvas, left_pad, top_pad, right_pad, bottom_pad, "constant", (1, 2, 3))
        y, x = crop.window(rng, *canvas.shape[:2])
        assert min(left, top, right, bottom) >= 0 and right + left > 0
        assert np.array_equal(image.numpy(), ref[y : y + 44, x : x + 44]), f"sample {label}"


def test_cifar_recipe_draws_cover_every_offset() -> None:
    crop = RandomCrop(32, padding=4)
    offsets = np.array([crop.window(SampleRandom(0, 0, i), 32, 32) for i in range(4000)])
    assert offsets.min() == 0 and offsets.max() == 8
    counts = np.bincount(offsets[:, 0], minlength=9)
    # Uniform over the 9 offsets: a chi-square of 8 degrees of freedom stays under 26.1 with probability 0.999.
    assert ((counts - 4000 / 9) ** 2 / (4000 / 9)).sum() < 26.1


def test_modes_other_than_constant_are_refused_in_a_gpu_graph_with_the_fix() -> None:
    from stallfree.transforms.spec import GraphState

    with pytest.raises(ValueError, match=r"RandomCrop\(padding_mode='reflect'\) runs on the CPU graph only.*use "
                                         r"padding_mode='constant'"):
        RandomCrop(8, padding=2, padding_mode="reflect").build(None, {"rows": None, "cols": None}, GraphState("gpu"))


def test_padding_table_is_np_pad() -> None:
    for mode in ("edge", "reflect", "symmetric"):
        assert padding_table(5, [(3, 2)], mode, 0, 10).tolist() == np.pad(np.arange(5), (3, 2), mode=mode).tolist()
        twice = np.pad(np.pad(np.arange(5), (3, 2), mode=mode), (1, 4), mode=mode)
        assert padding_table(5, [(3, 2), (1, 4)], mode, 0, 15).tolist() == twice.tolist()
    assert padding_table(4, [(2, 1)], "constant", 1, 5).tolist() == [-1, 0, 1, 2, 3]


def test_bad_arguments_are_refused_by_name(noise) -> None:
    with pytest.raises(ValueError, match=r"Pad: padding must be an int or a sequence of 1, 2 or 4 ints"):
        Pad((1, 2, 3))
    with pytest.raises(ValueError, match=r"RandomCrop: negative padding \(a crop\) is not reproduced"):
        RandomCrop(8, padding=-1)
    with pytest.raises(ValueError, match=r"Pad: padding_mode must be one of"):
        Pad(1, padding_mode="wrap")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Pad: fill must be a number or 1 or 3 numbers"):
        Pad(1, fill=(1, 2))
    with pytest.raises(ValueError, match=r"required crop size \(40, 40\) is larger than the input image size"):
        RandomCrop(40).window(SampleRandom(0, 0, 0), 30, 50)
    with pytest.raises(ValueError, match=r"RandomZoomOut: side_range must be \(min, max\) with 1 <= min <= max"):
        RandomZoomOut(side_range=(0.5, 2.0))
    source, _ = noise
    with pytest.raises(ValueError, match=r"Pad: fill \(300.0, 300.0, 300.0\) is outside a uint8 image's 0..255"):
        Loader(source, batch_size=4, transform=[Pad(1, fill=300), RandomCrop(8)])
