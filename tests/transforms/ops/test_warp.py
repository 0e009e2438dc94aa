"""RandomRotation, RandomAffine, RandomPerspective in the running CPU graph against PIL's own rotate and transform."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stallfree import Loader
from stallfree.transforms import CenterCrop, Normalize
from stallfree.transforms.kernels.warp import warp
from stallfree.transforms.ops.warp import (
    RandomAffine,
    RandomPerspective,
    RandomRotation,
    affine_matrix,
    perspective_coefficients,
    rotation_matrix,
)
from stallfree.transforms.random import SampleRandom

PIL_FILTERS = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
               "bicubic": Image.Resampling.BICUBIC}


@pytest.fixture(scope="module")
def pngs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray]]:
    root = tmp_path_factory.mktemp("pngs")
    rng = np.random.default_rng(9)
    images, lines = [], ["path,label"]
    for i, (h, w) in enumerate([(30, 40), (41, 23), (32, 32), (17, 50), (25, 25), (36, 28)]):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.png")
        images.append(pixels)
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines))
    return root / "list.csv", images


def center(image: np.ndarray, size: int) -> np.ndarray:
    """CenterCrop(size) of ``image``, zero-padded as torchvision's where the image is smaller."""
    h, w = image.shape[:2]
    top, left = CenterCrop(size).anchor(h, w)
    pad = np.zeros((max(h, size) + 2 * size, max(w, size) + 2 * size, 3), np.uint8)
    pad[size : size + h, size : size + w] = image
    return pad[size + top : size + top + size, size + left : size + left + size]


def run(source: Path, transform: list, seed: int) -> list[tuple[int, np.ndarray]]:
    loader = Loader(source, batch_size=2, transform=transform, shuffle=False, num_threads=1, dtype="uint8",
                    layout="NHWC", seed=seed)
    return [(int(label), image.numpy()) for images, labels in loader
            for image, label in zip(images, labels, strict=True)]


@pytest.mark.slow
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("expand", [False, True])
def test_rotation_equals_pil_rotate(pngs, interpolation, expand) -> None:
    source, originals = pngs
    fill = (10, 120, 230)
    step = RandomRotation(170, interpolation=interpolation, expand=expand, fill=fill)
    # A centre crop larger than any rotated image keeps every pixel (expand gives each sample its own size).
    for label, image in run(source, [step, CenterCrop(64)], seed=2):
        angle = step.angle(SampleRandom(2, 0, label))
        ref = Image.fromarray(originals[label]).rotate(angle, PIL_FILTERS[interpolation], expand, fillcolor=fill)
        assert np.array_equal(image, center(np.asarray(ref), 64)), f"sample {label} angle {angle}"


@pytest.mark.parametrize("angle", [0.0, 90.0, 180.0, 270.0, -90.0, 360.0, 45.0])
@pytest.mark.parametrize("expand", [False, True])
def test_whole_turns_take_pils_fast_paths(angle, expand) -> None:
    image = np.random.default_rng(0).integers(0, 256, (7, 11, 3), dtype=np.uint8)
    for center in (None, (3.0, 2.0)):
        m, (h, w) = rotation_matrix(angle, 7, 11, expand, center)
        out = np.empty((h, w, 3), np.uint8)
        warp(out, image, np.array([0, 0, *m, 0, 0, 1, 0, 0, 0], np.float64))
        ref = Image.fromarray(image).rotate(angle, Image.Resampling.NEAREST, expand, center)
        assert np.array_equal(out, np.asarray(ref)), (angle, expand, center)


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_affine_equals_pil_transform_of_torchvisions_matrix(pngs, interpolation) -> None:
    source, originals = pngs
    step = RandomAffine(25, translate=(0.2, 0.1), scale=(0.7, 1.3), shear=(-10, 10, -5, 5),
                        interpolation=interpolation, fill=7)
    for label, image in run(source, [step, CenterCrop(16)], seed=3):
        src = originals[label]
        h, w = src.shape[:2]
        angle, translate, scale, shear = step.sample(SampleRandom(3, 0, label), h, w)
        m = affine_matrix([w * 0.5, h * 0.5], angle, translate, scale, shear)
        ref = np.asarray(Image.fromarray(src).transform((w, h), Image.Transform.AFFINE, m,
                                                        PIL_FILTERS[interpolation], fillcolor=(7, 7, 7)))
        assert np.array_equal(image, center(ref, 16)), f"sample {label}"


def test_affine_matrix_is_rotation_about_the_centre() -> None:
    # F.affine's angle turns clockwise: at 90 degrees about (5, 5), output (x, y) reads the source at (y, 10 - x).
    m = affine_matrix([5.0, 5.0], 90.0, (0, 0), 1.0, (0.0, 0.0))
    np.testing.assert_allclose(m, [0, 1, 0, -1, 0, 10], atol=1e-12)
    scaled = affine_matrix([0.0, 0.0], 0.0, (2, 3), 2.0, (0.0, 0.0))  # output = 2 * source + (2, 3)
    np.testing.assert_allclose(scaled, [0.5, 0, -1, 0, 0.5, -1.5], atol=1e-12)


def test_perspective_equals_pil_transform(pngs) -> None:
    source, originals = pngs
    step = RandomPerspective(0.6, p=0.7, fill=(1, 2, 3))
    applied = 0
    for label, image in run(source, [step, CenterCrop(64)], seed=4):
        src = originals[label]
        h, w = src.shape[:2]
        rng = SampleRandom(4, 0, label)
        if rng.random() < 0.7:
            start = [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]
            coeffs = perspective_coefficients(start, step.corners(rng, h, w))
            ref = np.asarray(Image.fromarray(src).transform((w, h), Image.Transform.PERSPECTIVE, coeffs,
                                                            Image.Resampling.BILINEAR, fillcolor=(1, 2, 3)))
            applied += 1
        else:
            ref = src
        assert np.array_equal(image, center(ref, 64)), f"sample {label}"
    assert 0 < applied < len(originals)


def test_perspective_coefficients_map_the_corners() -> None:
    start = [[0, 0], [9, 0], [9, 7], [0, 7]]
    end = [[1, 2], [8, 1], [9, 6], [0, 7]]
    a = perspective_coefficients(start, end)
    for (x, y), (u, v) in zip(end, start, strict=True):
        w = a[6] * x + a[7] * y + 1
        assert abs((a[0] * x + a[1] * y + a[2]) / w - u) < 1e-4 and abs((a[3] * x + a[4] * y + a[5]) / w - v) < 1e-4


@pytest.mark.slow
def test_draws_follow_torchvisions_definitions() -> None:
    n = 4000
    angles = np.array([RandomRotation((10, 50)).angle(SampleRandom(0, 0, i)) for i in range(n)])
    assert 10 <= angles.min() and angles.max() < 50 and abs(angles.mean() - 30) < 0.6
    affine = RandomAffine(0, translate=(0.25, 0.0))
    shifts = np.array([affine.sample(SampleRandom(0, 1, i), 20, 40)[1][0] for i in range(n)])
    assert shifts.min() == -10 and shifts.max() == 10  # round(uniform(-10, 10))
    corners = np.array([RandomPerspective(0.5).corners(SampleRandom(0, 2, i), 20, 40) for i in range(n)])
    assert corners[:, 0, 0].max() == 10 and corners[:, 1, 0].min() == 29  # int(0.5 * 20) + 1 values each
    assert math.isclose(np.mean(corners[:, 0, 1]), 2.5, abs_tol=0.15)


def test_refusals_name_the_fix(pngs) -> None:
    source, _ = pngs
    with pytest.raises(ValueError, match=r"RandomRotation runs on uint8 images.*put it before ToTensor"):
        Loader(source, batch_size=2, transform=[CenterCrop(8), Normalize(), RandomRotation(10)])
    with pytest.raises(ValueError, match=r"RandomAffine: interpolation must be one of \('nearest', 'bilinear', "
                                         r"'bicubic'\)"):
        RandomAffine(10, interpolation="lanczos")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"RandomRotation: if degrees is a single number, it must be positive"):
        RandomRotation(-3)
    with pytest.raises(ValueError, match=r"RandomAffine: shear must be a number or a sequence of length 2 or 4"):
        RandomAffine(0, shear=(1, 2, 3))


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_the_gpu_graphs_warp_is_pils_but_at_the_edges(interpolation) -> None:
    """dali_warp (DALI's warp_perspective, which the GPU graph runs) on DALI's CPU backend, against PIL."""
    from nvidia.dali import fn, pipeline_def

    from stallfree.transforms.ops.warp import dali_warp

    rng = np.random.default_rng(11)
    images = [rng.integers(0, 256, (30, 40, 3), dtype=np.uint8) for _ in range(6)]
    step = RandomAffine(40, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=10, interpolation=interpolation, fill=9)
    drawn = [step.draw(SampleRandom(0, 0, i), (30, 40))[0] for i in range(6)]

    @pipeline_def(batch_size=6, num_threads=1, device_id=None)
    def pipeline():
        params = {"size": fn.external_source(name="size"), "warp": fn.external_source(name="warp")}
        return dali_warp(fn.external_source(name="image", layout="HWC"), params, interpolation, (9, 9, 9), "cpu")

    pipe = pipeline()
    pipe.build()
    pipe.feed_input("image", images)
    pipe.feed_input("size", [d["size"] for d in drawn])
    pipe.feed_input("warp", [d["warp"] for d in drawn])
    (out,) = pipe.run()
    y, x = np.mgrid[0:30, 0:40] + 0.5
    for k in range(6):
        a = drawn[k]["warp"][2:8]
        ref = np.asarray(Image.fromarray(images[k]).transform((40, 30), Image.Transform.AFFINE, a,
                                                              PIL_FILTERS[interpolation], fillcolor=(9, 9, 9)))
        diff = np.abs(np.asarray(out[k]).astype(int) - ref).max(-1)
        if interpolation == "nearest":
            assert (diff == 0).mean() > 0.998  # float32 coordinates, where a pixel boundary is within rounding
        else:
            sx, sy = a[0] * x + a[1] * y + a[2], a[3] * x + a[4] * y + a[5]
            inside = (sx >= 1.5) & (sx <= 38.5) & (sy >= 1.5) & (sy <= 28.5)
            assert diff[inside].max() <= 1 and inside.mean() > 0.5  # rounds where PIL truncates
