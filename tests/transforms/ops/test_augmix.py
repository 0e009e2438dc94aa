"""AugMix: torchvision's definition in the graph, its draws, its magnitude tables and its checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stallfree.transforms import AugMix, CenterCrop
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.dali_types import dali_type
from stallfree.transforms.ops.augmix import dirichlet, linspace32
from stallfree.transforms.random import SampleRandom, batch_random

SIZE = (19, 24)


def images_of(seed: int, count: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        image = rng.integers(0, 256, (*SIZE, 3)).astype(np.uint8)
        if k % 2:
            image = (image // 4 + 60).astype(np.uint8)  # a narrow range: autocontrast and equalize move it
        out.append(image)
    return out


def run_graph(step: Any, images: list[np.ndarray]) -> list[np.ndarray]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    compiled = CompiledTransforms([step, CenterCrop(SIZE)], dtype="uint8", layout="NHWC")

    @pipeline_def(batch_size=len(images), num_threads=2, device_id=None, exec_dynamic=True, enable_conditionals=True)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        params = {n: fn.external_source(name=n, dtype=dali_type(k)) for n, k in compiled.param_inputs.items()}
        return compiled.build(source, params, device="cpu", encoded=False)

    p = pipe()
    p.build()
    params = compiled.draw(batch_random(5, 2, range(len(images))), [SIZE] * len(images))
    p.feed_input("images", images)
    for name, values in params.items():
        p.feed_input(name, values)
    (out,) = p.run()
    return [np.array(out[i]) for i in range(len(images))]



def test_chains_are_drawn_as_torchvision_draws_them() -> None:
    step, n = AugMix(severity=4, all_ops=False), 3000
    plans = [step.plan(SampleRandom(7, 0, s), SIZE) for s in range(n)]
    depths = np.array([len(chain) for _, chains in plans for chain in chains])
    assert set(depths) == {1, 2, 3} and all(abs(np.mean(depths == d) - 1 / 3) < 0.02 for d in (1, 2, 3))
    ops = [op for _, chains in plans for chain in chains for op, _ in chain]
    assert set(ops) == set(step.ops()) and len(step.ops()) == 9  # no brightness, colour, contrast, sharpness
    rotations = np.array([m for _, chains in plans for chain in chains for op, m in chain if op == "Rotate"])
    assert set(np.abs(rotations)) == set(linspace32(0, 30, 10)[:4].astype(float))  # bins below severity
    assert abs(np.mean(rotations[rotations != 0] > 0) - 0.5) < 0.06  # a random sign
    weights = np.array([w for w, _ in plans])
    np.testing.assert_allclose(weights.sum(1), 1.0, atol=1e-6)


def test_dirichlet_weights_follow_their_distribution() -> None:
    # Dirichlet(a, a)'s first component is Beta(a, a): for a = 1 uniform, for a = 0.5 arcsine.
    n = 4000
    for alpha, cdf in ((1.0, lambda x: x), (0.5, lambda x: 2 / np.pi * np.arcsin(np.sqrt(x)))):
        first = np.sort([dirichlet(SampleRandom(3, 1, s), [alpha, alpha])[0] for s in range(n)])
        gap = np.max(np.abs(cdf(first) - np.arange(1, n + 1) / n))
        assert gap < 1.949 / np.sqrt(n), alpha  # the one-sample KS critical value, alpha = 0.001


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"AugMix: the severity must be between \[1, 10\]. Got 11 instead."):
        AugMix(severity=11)
    with pytest.raises(ValueError, match="chain_depth must be 1, 2, 3 or negative"):
        AugMix(chain_depth=4)
    with pytest.raises(ValueError, match="alpha must be positive"):
        AugMix(alpha=0)


@pytest.mark.torchvision
@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_magnitude_tables_are_torchvisions(variant: str) -> None:
    if variant == "v1":
        from torchvision.transforms import AugMix as TorchAugMix
    else:
        from torchvision.transforms.v2 import AugMix as TorchAugMix

    ours, theirs = AugMix(severity=10, variant=variant), TorchAugMix(severity=10)  # type: ignore[arg-type]
    for height, width in [(20, 27), (17, 31), (224, 224), (333, 500)]:
        if variant == "v1":
            space = theirs._augmentation_space(10, (height, width))
        else:
            space = {op: (make(10, height, width), signed) for op, (make, signed) in theirs._AUGMENTATION_SPACE.items()}
        assert list(space) == list(ours.ops())
        for op, (magnitudes, _) in space.items():
            table = ours.magnitudes(op, (height, width))
            assert (table is None) if magnitudes is None or magnitudes.ndim == 0 else np.array_equal(
                table, magnitudes.numpy()), op


def torchvision_augmix(variant: str, image: np.ndarray, weights: np.ndarray, chains: list[Any],
                       interpolation: str, fill: Any) -> np.ndarray:
    """torchvision's AugMix.forward on a uint8 image with the given weights and chains (its own operations)."""
    import torch
    import torchvision.transforms as T

    batch = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    mode = T.InterpolationMode(interpolation)
    if variant == "v1":
        from torchvision.transforms.autoaugment import _apply_op

        def apply(img: Any, op: str, magnitude: float) -> Any:
            return _apply_op(img, op, magnitude, interpolation=mode, fill=None if fill is None else [float(fill)] * 3)
    else:
        from torchvision.transforms import v2

        own = v2.AugMix(interpolation=mode, fill=fill)

        def apply(img: Any, op: str, magnitude: float) -> Any:
            return own._apply_image_or_video_transform(img, op, magnitude, interpolation=mode, fill=own._fill)

    mix = torch.tensor(weights[0]) * batch
    for i, chain in enumerate(chains):
        aug = batch
        for op, magnitude in chain:
            aug = apply(aug, op, magnitude)
        mix.add_(torch.tensor(weights[i + 1]) * aug)
    return mix.to(torch.uint8).permute(1, 2, 0).numpy()


@pytest.mark.torchvision
@pytest.mark.parametrize(("variant", "interpolation", "fill"), [
    ("v1", "bilinear", None), ("v2", "bilinear", None), ("v1", "nearest", 90), ("v2", "nearest", None)])
def test_graph_matches_torchvision_on_the_same_draws(variant: str, interpolation: str, fill: Any) -> None:
    # Bound: 99% of values exact and 99.5% within one level (measured: 99.5-99.8% and 99.7-99.9%). The operations
    # other than the warps equal torchvision's tensor functions on v1's arithmetic; the rest differ where a warp's
    # source coordinate falls within float32 error of a pixel boundary (nearest: the other neighbour, any number
    # of levels) or its bilinear weights round otherwise (a level), and where v2's fused multiply-adds in
    # brightness, colour and contrast move a value by a level, which a later solarize or equalize can amplify.
    images = images_of(11, 24)
    step = AugMix(severity=6, interpolation=interpolation, fill=fill, variant=variant)  # type: ignore[arg-type]
    outs = run_graph(step, images)
    streams = batch_random(5, 2, range(len(images)))
    exact = close = total = 0
    for image, out, rng in zip(images, outs, streams, strict=True):
        weights, chains = step.plan(rng, SIZE)
        diff = np.abs(out.astype(np.int64) - torchvision_augmix(variant, image, weights, chains, interpolation, fill))
        exact, close, total = exact + int((diff == 0).sum()), close + int((diff <= 1).sum()), total + diff.size
    assert exact >= 0.99 * total and close >= 0.995 * total, (exact / total, close / total)


@pytest.mark.torchvision
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvisions_augmix_translates(version: str) -> None:
    from stallfree.transforms.translation.translator import to_steps

    if version == "v1":
        import torchvision.transforms as T
    else:
        import torchvision.transforms.v2 as T
    steps = to_steps(T.AugMix(severity=5, mixture_width=2, chain_depth=2, alpha=0.5, all_ops=False)).steps
    assert steps == (AugMix(5, 2, 2, 0.5, False, "bilinear", 0.0, version),)  # torchvision's None: zeros


@pytest.mark.torchvision
def test_augmix_with_a_per_channel_fill_is_refused_by_name() -> None:
    import torchvision.transforms.v2 as T

    from stallfree.transforms.translation.translator import to_steps

    assert to_steps(T.AugMix(fill=7)).steps == (AugMix(fill=7.0, variant="v2"),)
    with pytest.raises(ValueError, match=r"transform\[0\]: AugMix\(fill=\[1, 2, 3\]\) is not reproduced"):
        to_steps([T.AugMix(fill=[1, 2, 3])])
    with pytest.raises(ValueError, match=r"AugMix\(interpolation='bicubic'\) is not reproduced; use NEAREST"):
        to_steps([T.AugMix(interpolation=T.InterpolationMode.BICUBIC)])
