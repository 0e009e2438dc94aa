"""torchvision's photometric transforms in the graph: their pixels against torchvision's, their draws, their checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from ks import ks_statistic

from stallfree.transforms import (
    CenterCrop,
    GaussianBlur,
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomInvert,
)
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.dali_types import dali_type
from stallfree.transforms.random import SampleRandom, batch_random
from stallfree.transforms.spec import GraphState

CROP = 12


def images_of(dtype: type, seed: int = 0) -> list[np.ndarray]:
    """Small images, some with a narrow range of values (where autocontrast and equalize do most)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(12):
        h, w = (int(v) for v in rng.integers(1, 30, 2))
        if k == 0:
            h, w = 2, 7  # too small for sharpness, which leaves it as it is
        low = int(rng.integers(0, 200))
        span = 256 if k % 3 == 0 else int(rng.integers(1, 56))
        image = rng.integers(low, min(low + span, 256), (h, w, 3)).astype(np.uint8)
        if k == 1:
            image[..., 1] = 77  # a constant channel
        out.append(image if dtype == np.uint8 else (image / 255).astype(np.float32))
    return out


def run_graph(steps: list[Any], images: list[np.ndarray], dtype: Any = "uint8",
              crop: Any = CROP) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    compiled = CompiledTransforms([*steps, CenterCrop(crop)], dtype=dtype, layout="NHWC")

    @pipeline_def(batch_size=len(images), num_threads=2, device_id=None, exec_dynamic=True, enable_conditionals=True)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        params = {n: fn.external_source(name=n, dtype=dali_type(k)) for n, k in compiled.param_inputs.items()}
        return compiled.build(source, params, device="cpu", encoded=False)

    p = pipe()
    p.build()
    params = compiled.draw(batch_random(5, 2, range(len(images))), [im.shape[:2] for im in images])
    p.feed_input("images", images)
    for name, values in params.items():
        p.feed_input(name, values)
    (out,) = p.run()
    return [np.array(out[i]) for i in range(len(images))], params


def center(image: np.ndarray) -> np.ndarray:
    top, left = CenterCrop(CROP).anchor(*image.shape[:2])
    padded = np.pad(image, ((CROP, CROP), (CROP, CROP), (0, 0)))
    return padded[top + CROP : top + 2 * CROP, left + CROP : left + 2 * CROP]


def test_steps_in_the_graph_equal_their_kernels_outside() -> None:
    # The graph-side statistics (DALI's reductions for autocontrast, the table kernel for equalize) against the
    # same kernels run on NumPy arrays, which the torchvision tests below hold to torchvision's pixels.
    images = images_of(np.uint8)
    chain = [RandomAutocontrast(0.8, "v2"), RandomEqualize(0.8), RandomAdjustSharpness(1.7, 0.8), RandomInvert(0.5)]
    outs, params = run_graph(chain, images)
    for i, image in enumerate(images):
        x = image
        for k, step in enumerate(chain):
            x = step.apply(x, {name: params[f"{k}.{name}"][i] for name in step.params})
        assert np.array_equal(outs[i], center(x)), i


@pytest.mark.parametrize("step", [RandomInvert(0.3), RandomAutocontrast(0.3), RandomEqualize(0.3),
                                  RandomAdjustSharpness(2.0, 0.3)])
def test_apply_is_drawn_with_probability_p(step: Any) -> None:
    n = 4000
    key = "apply" if "apply" in step.params else "config"  # config: (apply, variant)
    applied = sum(int(step.draw(SampleRandom(1, 0, s), (8, 8))[0][key][0]) for s in range(n))
    assert abs(applied / n - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5  # four standard deviations



def ks_critical(n: int, m: int) -> float:
    return 1.949 * ((n + m) / (n * m)) ** 0.5  # alpha = 0.001


def test_blur_sigma_is_uniform_per_sample() -> None:
    step, n = GaussianBlur(5, (0.3, 1.7)), 3000
    sigmas = np.array([step.draw(SampleRandom(4, 1, s), (9, 9))[0]["sigma"] for s in range(n)])
    assert np.array_equal(sigmas[:, 0], sigmas[:, 1])  # one sigma for both axes, as torchvision
    uniform = np.random.default_rng(0).uniform(0.3, 1.7, n)
    assert ks_statistic(sigmas[:, 0], uniform) < ks_critical(n, n)
    assert GaussianBlur(3, 0.8).draw(SampleRandom(0, 0, 0), (5, 5))[0]["sigma"].tolist() == pytest.approx([0.8] * 2)


def test_arguments_are_checked_as_torchvision_does() -> None:
    with pytest.raises(ValueError, match="kernel size value should be an odd and positive number"):
        GaussianBlur((3, 4))
    with pytest.raises(ValueError, match=r"sigma values should be positive and of the form \(min, max\)"):
        GaussianBlur(3, (2.0, 1.0))
    with pytest.raises(ValueError, match="if sigma is a single number, it must be positive"):
        GaussianBlur(3, 0)
    with pytest.raises(ValueError, match=r"RandomInvert: p must be in \[0, 1\], got 1.5"):
        RandomInvert(1.5)
    with pytest.raises(ValueError, match="sharpness_factor should be non-negative, got -1"):
        RandomAdjustSharpness(-1)
    with pytest.raises(ValueError, match="variant must be 'v1' or 'v2'"):
        RandomAutocontrast(0.5, "v3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="RandomEqualize: only uint8 images are supported"):
        RandomEqualize().prepare(GraphState("cpu", "float32"))
    assert RandomEqualize(0).is_identity() and not RandomInvert(0.1).is_identity()


# --- against torchvision --------------------------------------------------------------------------------------------


def torchvision_api(variant: str) -> Any:
    if variant == "v1":
        import torchvision.transforms.functional as F
    else:
        import torchvision.transforms.v2.functional as F
    return F


def chw(image: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(image).permute(2, 0, 1).contiguous()


def hwc(tensor: Any) -> np.ndarray:
    return tensor.permute(1, 2, 0).numpy()


def stallfree_and_torchvision(name: str, variant: str, image: np.ndarray, factor: float) -> tuple[Any, Any]:
    F, code = torchvision_api(variant), 1 if variant == "v1" else 2  # noqa: N806 - torchvision's alias
    if name == "invert":
        return RandomInvert(1.0).apply(image, {"apply": [1]}), hwc(F.invert(chw(image)))
    if name == "autocontrast":
        step = RandomAutocontrast(1.0, variant)  # type: ignore[arg-type]
        return step.apply(image, {"config": [1, code]}), hwc(F.autocontrast(chw(image)))
    if name == "equalize":
        return RandomEqualize(1.0).apply(image, {"apply": [1]}), hwc(F.equalize(chw(image)))
    step = RandomAdjustSharpness(factor, 1.0, variant)  # type: ignore[arg-type]
    params = step.draw(SampleRandom(0, 0, 0), image.shape[:2])[0]
    return step.apply(image, params), hwc(F.adjust_sharpness(chw(image), factor))


@pytest.mark.torchvision
@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize(("name", "dtype"), [
    (name, dtype) for name in ("invert", "autocontrast", "equalize", "sharpness") for dtype in (np.uint8, np.float32)
    if (name, dtype) != ("equalize", np.float32)  # uint8 only, as torchvision's v1 (test_arguments_are_checked...)
])
def test_pixels_equal_torchvisions_tensor_path(name: str, dtype: type, variant: str) -> None:
    # Exact on uint8 images (every step is integer or float32 arithmetic that the kernels repeat operation for
    # operation); on float images sharpness sums its 3x3 window in another order than torch's conv2d: 1e-6.
    factors = [0.0, 0.3, 1.0, 1.7, 5.3] if name == "sharpness" else [0.0]
    for image in images_of(dtype, seed=3):
        for factor in factors:
            ours, theirs = stallfree_and_torchvision(name, variant, image, factor)
            assert ours.dtype == theirs.dtype
            if dtype == np.uint8:
                assert np.array_equal(ours, theirs), (image.shape, factor)
            else:
                np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)


@pytest.mark.torchvision
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvisions_classes_translate_with_their_parameters(version: str) -> None:
    from stallfree.transforms import (
        GaussianNoise,
        RandomChannelPermutation,
        RandomPhotometricDistort,
        RandomPosterize,
        RandomSolarize,
    )
    from stallfree.transforms.translation.translator import to_steps

    if version == "v1":
        import torchvision.transforms as T
    else:
        import torchvision.transforms.v2 as T
    pipeline = [T.RandomSolarize(100, 0.2), T.RandomPosterize(3, 0.4), T.RandomInvert(0.1),
                T.RandomAutocontrast(0.6), T.RandomEqualize(0.7), T.RandomAdjustSharpness(1.5, 0.8),
                T.GaussianBlur((5, 3), (0.2, 1.5)), T.GaussianBlur(7, 0.9)]
    if version == "v2":
        pipeline += [T.RandomPhotometricDistort((0.9, 1.1), p=0.4), T.RandomChannelPermutation(),
                     T.GaussianNoise(0.1, 0.2, clip=False)]
    assert to_steps(T.Compose(pipeline)).steps == (
        RandomSolarize(100.0, 0.2), RandomPosterize(3, 0.4), RandomInvert(0.1), RandomAutocontrast(0.6, version),
        RandomEqualize(0.7), RandomAdjustSharpness(1.5, 0.8, version), GaussianBlur((5, 3), (0.2, 1.5)),
        GaussianBlur((7, 7), (0.9, 0.9)), *([RandomPhotometricDistort((0.9, 1.1), p=0.4), RandomChannelPermutation(),
                                             GaussianNoise(0.1, 0.2, False)] if version == "v2" else []))


@pytest.mark.torchvision
@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_blur_in_the_graph_is_within_one_level_of_torchvision(variant: str) -> None:
    F = torchvision_api(variant)  # noqa: N806 - torchvision's alias
    images = [im for im in images_of(np.uint8, seed=8) if min(im.shape[:2]) > 4]  # torch's reflect needs pad < size
    exact = total = 0
    for kernel_size in [(5, 3), (1, 3), (3, 5)]:
        step = GaussianBlur(kernel_size, (0.1, 3.0))
        outs, params = run_graph([step], images)
        for i, image in enumerate(images):
            sigma = float(params["0.sigma"][i][0])
            theirs = center(hwc(F.gaussian_blur(chw(image), list(kernel_size), [sigma, sigma])))
            diff = np.abs(outs[i].astype(np.int64) - theirs)
            assert diff.max() <= 1, (kernel_size, image.shape, sigma)
            exact, total = exact + int((diff == 0).sum()), total + diff.size
    assert exact >= 0.999 * total


@pytest.mark.torchvision
def test_blur_of_float_images_is_within_3e_7_of_torchvision() -> None:
    from stallfree.transforms import Normalize

    F = torchvision_api("v2")  # noqa: N806 - torchvision's alias
    images = [im for im in images_of(np.uint8, seed=9) if min(im.shape[:2]) > 4]
    outs, params = run_graph([Normalize((0.0,), (1.0,)), GaussianBlur((5, 3), (0.1, 3.0))], images, "float32")
    for i, image in enumerate(images):
        sigma = float(params["1.sigma"][i][0])
        theirs = center(hwc(F.gaussian_blur(chw((image / 255).astype(np.float32)), [5, 3], [sigma, sigma])))
        np.testing.assert_allclose(outs[i], theirs, rtol=0, atol=3e-7)


@pytest.mark.torchvision
def test_blur_sigma_is_distributed_as_torchvisions() -> None:
    import torch
    import torchvision.transforms as T

    torch.manual_seed(0)
    theirs = np.array([T.GaussianBlur.get_params(0.1, 2.0) for _ in range(3000)])
    ours = np.array([GaussianBlur(3).draw(SampleRandom(2, 0, s), (9, 9))[0]["sigma"][0] for s in range(3000)])
    assert ks_statistic(ours, theirs) < ks_critical(3000, 3000)


# --- RandomPhotometricDistort ----------------------------------------------------------------------------------------


def test_photometric_distort_draws_torchvisions_parameters() -> None:
    from stallfree.transforms import RandomPhotometricDistort

    step, n = RandomPhotometricDistort(p=0.3), 4000
    draws = [step.draw(SampleRandom(3, 0, s), (8, 8))[0] for s in range(n)]
    enabled = np.array([[k in d["order"] for k in range(4)] for d in draws])  # b, c, s, h each with p
    assert np.all(np.abs(enabled.mean(0) - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5)
    permuted = np.array([d["perm"][0] for d in draws])
    assert abs(permuted.mean() - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    assert all(sorted(d["perm"][1:]) == [0, 1, 2] for d in draws)
    contrast_first = [list(d["order"]).index(1) == 1 for d in draws if d["order"][1] == 1 or d["order"][3] == 1]
    assert abs(np.mean(contrast_first) - 0.5) < 4 * (0.25 / len(contrast_first)) ** 0.5
    hue = np.array([d["factors"][3] for d in draws if 3 in d["order"]])
    uniform = np.random.default_rng(1).uniform(-0.05, 0.05, len(hue))
    assert ks_statistic(hue, uniform) < ks_critical(len(hue), len(uniform))


def test_photometric_distort_in_the_graph_equals_its_kernels_outside() -> None:
    from stallfree.transforms import RandomPhotometricDistort

    images = images_of(np.uint8, seed=4)
    step = RandomPhotometricDistort(p=0.7)
    outs, params = run_graph([step], images)
    for i, image in enumerate(images):
        ours = step.apply(image, {name: params[f"0.{name}"][i] for name in step.params})
        assert np.array_equal(outs[i], center(ours)), i


@pytest.mark.torchvision
@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["uint8", "float32"])
def test_photometric_distort_is_within_two_levels_of_torchvision(dtype: type) -> None:
    # The kernels compute torchvision's v1 formulas in float32; v2's fuse multiply-adds (and its grey and hue
    # steps round differently), so a uint8 value is a level or two off at times: 56 of 249,987 over 300 images.
    import torchvision.transforms.v2.functional as F  # noqa: N812 - torchvision's alias

    from stallfree.transforms import RandomPhotometricDistort

    step, rng = RandomPhotometricDistort(p=0.8), np.random.default_rng(5)
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    exact = total = 0
    for s in range(60):
        h, w = (int(v) for v in rng.integers(4, 30, 2))
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        image = image if dtype == np.uint8 else (image / 255).astype(np.float32)
        params = step.draw(SampleRandom(0, 0, s), (h, w))[0]
        theirs = chw(image)
        for k in params["order"]:
            if k >= 0:
                theirs = adjust[k](theirs, float(params["factors"][k]))
        if params["perm"][0]:
            theirs = F.permute_channels(theirs, [int(c) for c in params["perm"][1:]])
        ours, theirs = step.apply(image, params), hwc(theirs)
        if dtype == np.uint8:
            diff = np.abs(ours.astype(np.int64) - theirs)
            assert diff.max() <= 2
            exact, total = exact + int((diff == 0).sum()), total + diff.size
        else:
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-6)
    assert exact >= 0.999 * total


@pytest.mark.torchvision
@pytest.mark.parametrize("variant", ["v1", "v2"])
@pytest.mark.parametrize("name", ["invert", "autocontrast", "equalize", "sharpness"])
def test_pixels_against_torchvisions_pil_path(name: str, variant: str) -> None:
    # A torchvision pipeline over an ImageFolder applies these to PIL images, where PIL computes them: invert and
    # equalize (PIL's own table) are exact; autocontrast (PIL's double-precision table) and sharpness (PIL's
    # SMOOTH filter and blend) are within one level, autocontrast 99% exact with v1's arithmetic.
    from PIL import Image

    F = torchvision_api(variant)  # noqa: N806 - torchvision's alias
    exact = total = 0
    for image in images_of(np.uint8, seed=6):
        for factor in [0.3, 1.7] if name == "sharpness" else [0.0]:
            ours, _ = stallfree_and_torchvision(name, variant, image, factor)
            pil = Image.fromarray(image)
            call = {"invert": F.invert, "autocontrast": F.autocontrast, "equalize": F.equalize,
                    "sharpness": lambda img, f=factor: F.adjust_sharpness(img, f)}[name]
            diff = np.abs(ours.astype(np.int64) - np.asarray(call(pil)).astype(np.int64))
            assert diff.max() <= (0 if name in ("invert", "equalize") else 1), (name, image.shape, factor)
            exact, total = exact + int((diff == 0).sum()), total + diff.size
    if name == "autocontrast" and variant == "v1":
        assert exact >= 0.99 * total


def test_channel_permutation_draws_every_permutation_alike() -> None:
    from stallfree.transforms import RandomChannelPermutation

    step, n = RandomChannelPermutation(), 6000
    perms = [tuple(step.draw(SampleRandom(8, 0, s), (4, 4))[0]["perm"][1:]) for s in range(n)]
    counts = np.array([perms.count(p) for p in sorted(set(perms))])
    assert len(counts) == 6 and np.all(np.abs(counts / n - 1 / 6) < 4 * (5 / 36 / n) ** 0.5)
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    assert np.array_equal(step.apply(image, {"perm": [1, 2, 0, 1]}), image[..., [2, 0, 1]])


# --- JPEG ------------------------------------------------------------------------------------------------------------


def test_jpeg_quality_is_drawn_uniformly_and_checked() -> None:
    from stallfree.transforms import JPEG

    n = 5000
    qualities = np.array([int(JPEG((20, 24)).draw(SampleRandom(6, 0, s), (8, 8))[0]["quality"]) for s in range(n)])
    counts = np.bincount(qualities, minlength=25)[20:25]
    assert np.all(np.abs(counts / n - 0.2) < 4 * (0.16 / n) ** 0.5)  # randint(min, max + 1): both ends included
    with pytest.raises(ValueError, match="quality must be an integer from 1 to 100"):
        JPEG((0, 50))
    with pytest.raises(TypeError, match="quality can't be bool"):
        JPEG(True)
    with pytest.raises(ValueError, match="JPEG: only uint8 images are supported"):
        JPEG(50).prepare(GraphState("cpu", "float32"))


@pytest.mark.torchvision
def test_jpeg_in_the_graph_equals_torchvisions() -> None:
    import torchvision.transforms.v2 as T
    import torchvision.transforms.v2.functional as F  # noqa: N812 - torchvision's alias

    from stallfree.transforms import JPEG
    from stallfree.transforms.translation.translator import to_steps

    assert to_steps(T.JPEG((5, 95))).steps == (JPEG((5, 95)),) and to_steps(T.JPEG(70)).steps == (JPEG((70, 70)),)
    rng = np.random.default_rng(12)
    images = []
    for _ in range(8):
        h, w = (int(v) for v in rng.integers(14, 40, 2))
        y, x = np.mgrid[0:h, 0:w]
        smooth = np.stack([x * 255 // w, y * 255 // h, (x + y) * 127 // (h + w)], -1)
        images.append(np.clip(smooth + rng.integers(-30, 30, (h, w, 3)), 0, 255).astype(np.uint8))
    outs, params = run_graph([JPEG((5, 100))], images)
    for i, image in enumerate(images):
        theirs = hwc(F.jpeg(chw(image), int(params["0.quality"][i])))
        assert np.array_equal(outs[i], center(theirs)), int(params["0.quality"][i])
