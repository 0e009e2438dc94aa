"""The bundled kernels equal NumPy references of their definitions; their draws follow torchvision's."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from stallfree.transforms import (
    Cutout,
    GaussianNoise,
    RandomErasing,
    RandomGrayscale,
    RandomPosterize,
    RandomSolarize,
)
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState

SHAPES = [(1, 1, 3), (13, 9, 3), (40, 56, 3)]
G, M1, M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def np_uniform(key: int, counter: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.uint64(key) * G + counter.astype(np.uint64) * G + G
        z = (z ^ (z >> np.uint64(30))) * M1
        z = (z ^ (z >> np.uint64(27))) * M2
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def np_normal(key: int, counter: np.ndarray) -> np.ndarray:
    u1, u2 = 1.0 - np_uniform(key, 2 * counter), np_uniform(key, 2 * counter + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def image_of(shape: tuple[int, ...], dtype: type, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, shape, dtype=np.uint8) if dtype == np.uint8 else rng.random(shape, dtype=np.float32)


def ref_erasing(img: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    out = img.copy()
    top, left, h, w = (int(v) for v in p["rect"])
    if h == 0:
        return out
    if p["key"][0] >= 0:
        c, y, x = np.meshgrid(np.arange(img.shape[2]), np.arange(h), np.arange(w), indexing="ij")
        noise = np_normal(int(p["key"][0]), (c * h + y) * w + x)  # (C, h, w) as torchvision's v
        out[top : top + h, left : left + w] = noise.transpose(1, 2, 0)
        return out
    value = np.broadcast_to(p["value"], (img.shape[2],)).astype(np.float64)
    if img.dtype == np.uint8:
        value = np.trunc(np.clip(value, 0, 255))
    out[top : top + h, left : left + w] = value
    return out


def ref_cutout(img: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    out = img.copy()
    for y1, y2, x1, x2 in p["holes"].reshape(-1, 4):
        out[y1:y2, x1:x2] = 0
    return out


def ref_noise(img: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    mean, sigma, clip = (float(v) for v in p["config"][:3])
    z = np_normal(int(p["key"][0]), np.arange(img.size).reshape(img.shape))
    if img.dtype == np.uint8:  # torchvision's: int16(mean * 255 + randn * (sigma * 255)), added, clamped or wrapped
        level = np.trunc(np.float32(mean * 255) + z.astype(np.float32) * np.float32(sigma * 255)).astype(np.int64)
        v = img.astype(np.int64) + level
        return (np.clip(v, 0, 255) if clip else v & 0xFF).astype(np.uint8)
    x = img.astype(np.float64) + mean + sigma * z
    return (np.clip(x, 0.0, 1.0) if clip else x).astype(np.float32)


def ref_solarize(img: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    bound = 255 if img.dtype == np.uint8 else 1.0
    return np.where((img >= p["threshold"][0]) & bool(p["apply"][0]), bound - img, img).astype(img.dtype)


def ref_posterize(img: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    return img & np.uint8(p["mask"][0]) if p["apply"][0] else img


def ref_grayscale(img: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    if not p["apply"][0]:
        return img
    f = img.astype(np.float32)
    luma = np.float32(0.2989) * f[..., 0] + np.float32(0.587) * f[..., 1] + np.float32(0.114) * f[..., 2]
    if img.dtype == np.uint8:
        luma = np.floor(luma)
    return np.repeat(luma[..., None], 3, -1).astype(img.dtype)


CASES: list[tuple[Any, Any, tuple[type, ...]]] = [
    (RandomErasing(p=0.8, value=(10, 300, -5)), ref_erasing, (np.uint8, np.float32)),
    (RandomErasing(p=0.8, value="random", scale=(0.1, 0.5)), ref_erasing, (np.float32,)),
    (Cutout(n_holes=2, length=6), ref_cutout, (np.uint8, np.float32)),
    (GaussianNoise(mean=0.05, sigma=0.2), ref_noise, (np.uint8, np.float32)),
    (GaussianNoise(sigma=0.5, clip=False), ref_noise, (np.uint8, np.float32)),
    (RandomSolarize(threshold=0.6, p=0.7), ref_solarize, (np.float32,)),
    (RandomSolarize(threshold=100, p=0.7), ref_solarize, (np.uint8,)),
    (RandomPosterize(bits=3, p=0.7), ref_posterize, (np.uint8,)),
    (RandomGrayscale(p=0.7), ref_grayscale, (np.uint8, np.float32)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_equals_numpy_reference(case: int) -> None:
    step, reference, dtypes = CASES[case]
    for dtype in dtypes:
        for s, shape in enumerate(SHAPES):
            for sample in range(4):
                image = image_of(shape, dtype, 10 * s + sample)
                params, size = step.draw(SampleRandom(5, 0, sample + 10 * s), shape[:2])
                assert size == shape[:2]
                got, want = step.apply(image, params), reference(image, params)
                assert got.dtype == image.dtype and got.shape == image.shape
                tol = 1e-5 if dtype == np.float32 else 0
                assert np.abs(got.astype(np.float64) - want.astype(np.float64)).max() <= tol, (step, shape, params)


def test_random_erasing_draw_keeps_torchvisions_get_params_rules() -> None:
    # torchvision's get_params: an area in scale * H * W, a log-uniform aspect h / w in ratio, rounded sides,
    # kept only strictly inside the image, at a uniform top-left; p decides whether to erase at all.
    step, height, width = RandomErasing(p=1.0), 32, 24
    aspects, tops = [], []
    for sample in range(400):
        top, left, h, w = step.draw(SampleRandom(0, 2, sample), (height, width))[0]["rect"].tolist()
        assert 0 < h < height and 0 < w < width, (h, w)
        assert 0 <= top <= height - h and 0 <= left <= width - w
        # the sides are rounded from sqrt(area * aspect) and sqrt(area / aspect): undo within half a pixel
        assert (h - 0.5) * (w - 0.5) <= 0.33 * height * width + 1e-9
        assert (h + 0.5) * (w + 0.5) >= 0.02 * height * width - 1e-9
        assert (h - 0.5) / (w + 0.5) <= 3.3 and (h + 0.5) / (w - 0.5) >= 0.3
        aspects.append(math.log(h / w))
        tops.append(top / (height - h) if height > h else 0.5)
    # log-uniform aspect: the logs of h / w spread over both sides of 0, as uniform on [log 0.3, log 3.3] does
    assert np.mean(np.array(aspects) > 0) == pytest.approx(math.log(3.3) / (math.log(3.3) - math.log(0.3)), abs=0.08)
    assert np.mean(tops) == pytest.approx(0.5, abs=0.06)  # uniform top-left
    erased = sum(RandomErasing(p=0.3).draw(SampleRandom(1, 0, i), (32, 24))[0]["rect"].tolist()[2] > 0
                 for i in range(2000))
    assert erased == pytest.approx(600, abs=4 * math.sqrt(2000 * 0.3 * 0.7))
    assert RandomErasing(p=0.0).draw(SampleRandom(0, 0, 0), (8, 8))[0]["rect"].tolist() == [0, 0, 0, 0]
    # a 1x1 image has no box strictly inside it: torchvision returns the image unchanged
    assert RandomErasing(p=1.0).draw(SampleRandom(0, 0, 0), (1, 1))[0]["rect"].tolist() == [0, 0, 0, 0]


def test_cutout_holes_are_clipped_squares_around_the_centre() -> None:
    for sample in range(30):
        params, _ = Cutout(n_holes=3, length=10).draw(SampleRandom(1, 0, sample), (12, 15))
        for y1, y2, x1, x2 in params["holes"].reshape(-1, 4):
            assert 0 <= y1 < y2 <= 12 and 0 <= x1 < x2 <= 15
            assert y2 - y1 <= 10 and x2 - x1 <= 10


def test_noise_is_standard_normal_and_keyed_by_sample() -> None:
    image = np.full((64, 64, 3), 0.5, np.float32)
    step = GaussianNoise(sigma=1.0, clip=False)
    p0, _ = step.draw(SampleRandom(0, 0, 0), (64, 64))
    first = step.apply(image, p0)
    noise = first - 0.5
    assert abs(noise.mean()) < 0.05 and abs(noise.std() - 1.0) < 0.05
    assert np.array_equal(step.apply(image, step.draw(SampleRandom(0, 0, 0), (64, 64))[0]), first)
    assert not np.array_equal(step.apply(image, step.draw(SampleRandom(0, 0, 1), (64, 64))[0]), first)


def test_arguments_are_checked_as_torchvision() -> None:
    with pytest.raises(ValueError, match='if value is str, it should be "random"'):
        RandomErasing(value="noise")
    with pytest.raises(ValueError, match="scale should be between 0 and 1"):
        RandomErasing(scale=(0.1, 1.5))
    with pytest.raises(ValueError, match="probability should be between 0 and 1"):
        RandomErasing(p=2)
    with pytest.warns(UserWarning, match=r"should be of kind \(min, max\)"):
        RandomErasing(ratio=(3.0, 0.3))
    with pytest.raises(ValueError, match="sigma shouldn't be negative"):
        GaussianNoise(sigma=-1)
    with pytest.raises(ValueError, match="bits should be between 0 and 8"):
        RandomPosterize(bits=9)
    with pytest.raises(ValueError, match="p must be in"):
        RandomGrayscale(p=-0.1)
    with pytest.raises(ValueError, match="length must be a positive int"):
        Cutout(length=0)


def test_dtype_limits_are_refused_when_the_graph_is_built() -> None:
    with pytest.raises(ValueError, match="only uint8 images"):
        RandomPosterize(bits=2).check(GraphState("cpu", "float32"))
    with pytest.raises(ValueError, match="needs a float image"):
        RandomErasing(value="random").check(GraphState("cpu", "uint8"))
    with pytest.raises(ValueError, match="should be less than the bound"):
        RandomSolarize(threshold=128).check(GraphState("cpu", "float32"))


@pytest.mark.torchvision
@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["uint8", "float32"])
def test_noise_equals_torchvisions_given_the_same_normals(dtype: type, clip: bool, monkeypatch: Any) -> None:
    # torchvision's gaussian_noise draws torch.randn_like; handing it the kernel's own normals (float32, CHW) must
    # give the kernel's pixels, which pins down the arithmetic around the draw (scaling, truncation, clamp, wrap).
    import torch
    import torchvision.transforms.v2.functional as F  # noqa: N812 - torchvision's alias

    image = image_of((13, 9, 3), dtype, 4)
    step = GaussianNoise(mean=0.02, sigma=0.3, clip=clip)
    params, _ = step.draw(SampleRandom(0, 0, 3), image.shape[:2])
    z = np_normal(int(params["key"][0]), np.arange(image.size).reshape(image.shape)).astype(np.float32)
    monkeypatch.setattr(torch, "randn_like", lambda t, dtype=None: torch.from_numpy(z).permute(2, 0, 1).to(
        dtype or t.dtype))
    theirs = F.gaussian_noise(torch.from_numpy(image).permute(2, 0, 1), mean=0.02, sigma=0.3, clip=clip)
    ours = step.apply(image, params)
    if dtype == np.uint8:
        assert np.array_equal(ours, theirs.permute(1, 2, 0).numpy())
    else:
        np.testing.assert_allclose(ours, theirs.permute(1, 2, 0).numpy(), rtol=0, atol=1e-6)
