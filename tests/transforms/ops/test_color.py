"""ColorJitter: torchvision's argument checks, draw order, and its tensor formulas (a NumPy reference here)."""

from __future__ import annotations

import numpy as np
import pytest

from stallfree.transforms import ColorJitter
from stallfree.transforms.random import SampleRandom

F = np.float32


def _finish(v: np.ndarray, bound: float, integral: bool) -> np.ndarray:
    v = np.clip(v, F(0), F(bound))
    return np.floor(v).astype(F) if integral else v


def _gray(img: np.ndarray, integral: bool) -> np.ndarray:
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    v = F(0.2989) * r + F(0.587) * g + F(0.114) * b
    return np.floor(v).astype(F) if integral else v


def _blend(img: np.ndarray, other: np.ndarray | np.float32, ratio: float, bound: float, integral: bool) -> np.ndarray:
    # torchvision's _blend(image1, image2, ratio): ratio is a Python float; torch casts ratio and (1.0 - ratio),
    # each taken in double, to the tensor's float32
    return _finish(F(ratio) * img + F(1.0 - ratio) * other, bound, integral)


def _rgb2hsv(img: np.ndarray) -> np.ndarray:
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    maxc, minc = img.max(-1), img.min(-1)
    eqc = maxc == minc
    cr = maxc - minc
    ones = np.ones_like(maxc)
    s = cr / np.where(eqc, ones, maxc)
    div = np.where(eqc, ones, cr)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    hr = (maxc == r) * (bc - gc)
    hg = ((maxc == g) & (maxc != r)) * (F(2) + rc - bc)
    hb = ((maxc != g) & (maxc != r)) * (F(4) + gc - rc)
    h = np.fmod((hr + hg + hb) / F(6) + F(1), F(1))
    return np.stack([h, s, maxc], -1).astype(F)


def _hsv2rgb(hsv: np.ndarray) -> np.ndarray:
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    i = np.floor(h * F(6))
    f = h * F(6) - i
    i = i.astype(np.int32) % 6
    p = np.clip(v * (F(1) - s), 0, 1)
    q = np.clip(v * (F(1) - s * f), 0, 1)
    t = np.clip(v * (F(1) - s * (F(1) - f)), 0, 1)
    table = np.stack([np.stack(c, -1) for c in [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]])
    return np.take_along_axis(table, i[None, ..., None], 0)[0].astype(F)


def _hue(img: np.ndarray, f: np.float32, integral: bool) -> np.ndarray:
    x = img / F(255) if integral else img
    hsv = _rgb2hsv(x)
    hsv[..., 0] = np.remainder(hsv[..., 0] + f, F(1))
    rgb = _hsv2rgb(hsv)
    return np.floor(rgb * F(255.999)).astype(F) if integral else rgb


def reference(image: np.ndarray, order: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """torchvision's ColorJitter.forward on an HWC image, in float32 NumPy."""
    integral = image.dtype == np.uint8
    bound = 255.0 if integral else 1.0
    img = image.astype(F)
    for op in order:
        if op < 0:
            continue
        f = float(factors[op])  # the Python float torchvision's get_params draws
        if op == 0:
            img = _blend(img, F(0), f, bound, integral)
        elif op == 1:
            img = _blend(img, F(_gray(img, integral).astype(np.float64).mean()), f, bound, integral)
        elif op == 2:
            img = _blend(img, _gray(img, integral)[..., None], f, bound, integral)
        else:
            img = _hue(img, F(f), integral)
    return img.astype(image.dtype)


def test_check_input_follows_torchvision() -> None:
    jitter = ColorJitter(brightness=0.5, contrast=(0.2, 1.5), saturation=2.0, hue=0.1)
    assert jitter.ranges() == ((0.5, 1.5), (0.2, 1.5), (0.0, 3.0), (-0.1, 0.1))
    assert ColorJitter().ranges() == (None, None, None, None)
    assert ColorJitter(brightness=(1, 1)).ranges()[0] is None
    with pytest.raises(ValueError, match="brightness is a single number, it must be non negative"):
        ColorJitter(brightness=-0.1)
    with pytest.raises(ValueError, match=r"hue values should be between \(-0.5, 0.5\)"):
        ColorJitter(hue=0.6)
    with pytest.raises(ValueError, match="contrast values should be between"):
        ColorJitter(contrast=(1.5, 0.5))
    with pytest.raises(TypeError, match="saturation should be a single number or a list/tuple with length 2"):
        ColorJitter(saturation=(1, 2, 3))


def test_draw_order_then_factors_from_the_sample_stream() -> None:
    jitter = ColorJitter(brightness=0.4, hue=0.2)
    params, size = jitter.draw(SampleRandom(3, 1, 7), (10, 12))
    rng = SampleRandom(3, 1, 7)
    perm = rng.permutation(4)
    b, h = rng.uniform(0.6, 1.4), rng.uniform(-0.2, 0.2)
    assert size == (10, 12)
    assert params["order"].tolist() == [i if i in (0, 3) else -1 for i in perm]
    np.testing.assert_allclose(params["factors"], [b, 0, 0, h], rtol=1e-6)
    again, _ = jitter.draw(SampleRandom(3, 1, 7), (10, 12))
    assert np.array_equal(again["order"], params["order"]) and np.array_equal(again["factors"], params["factors"])


@pytest.mark.parametrize("shape", [(1, 1, 3), (7, 5, 3), (32, 48, 3)])
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_kernel_matches_reference(shape: tuple[int, int, int], dtype: type) -> None:
    rng = np.random.default_rng(sum(shape))
    jitter = ColorJitter(brightness=0.5, contrast=0.6, saturation=0.7, hue=0.3)
    for sample in range(6):
        if dtype == np.uint8:
            image = rng.integers(0, 256, shape, dtype=np.uint8)
        else:
            image = rng.random(shape, dtype=np.float32)
        params, _ = jitter.draw(SampleRandom(0, 0, sample), shape[:2])
        got = jitter.apply(image, params["order"], params["factors"])
        want = reference(image, params["order"], params["factors"])
        tolerance = 1 if dtype == np.uint8 else 2e-5
        assert np.abs(got.astype(np.float64) - want).max() <= tolerance, (sample, params)


@pytest.mark.parametrize("op", [0, 1, 2, 3])
def test_each_adjustment_alone(op: int) -> None:
    image = np.random.default_rng(op).integers(0, 256, (9, 11, 3), dtype=np.uint8)
    order = np.array([op if i == op else -1 for i in range(4)], np.int32)
    factors = np.array([1.3, 0.6, 1.8, -0.25], np.float32)
    got = ColorJitter().apply(image, order, factors)
    assert np.abs(got.astype(np.int32) - reference(image, order, factors).astype(np.int32)).max() <= 1
    assert not np.array_equal(got, image)


@pytest.mark.parametrize("op", [0, 1, 2])
@pytest.mark.parametrize("factor", [1.3, 0.7, 1.7])
def test_blends_are_exact_against_torchvisions_tensor_arithmetic(op: int, factor: float) -> None:
    # Regression: the factor was rounded to float32 before 1 - f, so saturation 1.3 was one level off on ~6% of
    # pixels against torchvision's tensor path.
    image = np.random.default_rng(op).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    order = np.array([op if i == op else -1 for i in range(4)], np.int32)
    factors = np.zeros(4, np.float64)
    factors[op] = factor
    got = ColorJitter().apply(image, order, factors)
    assert np.array_equal(got, reference(image, order, factors))


def test_identity_factors_keep_the_image() -> None:
    image = np.random.default_rng(1).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    got = ColorJitter().apply(image, np.array([2, 0, 3, 1], np.int32), np.array([1, 1, 1, 0], np.float32))
    assert np.abs(got.astype(int) - image.astype(int)).max() <= 1


def test_apply_rejects_a_grey_image() -> None:
    with pytest.raises(ValueError, match="HWC RGB"):
        ColorJitter().apply(np.zeros((4, 4), np.uint8), np.zeros(4, np.int32), np.ones(4, np.float32))
