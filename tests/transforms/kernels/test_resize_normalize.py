"""The resampler writing the normalized float32 output itself equals resizing to uint8 and normalizing after."""

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stallfree import Loader
from stallfree.transforms import (
    ColorJitter,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from stallfree.transforms.compile import CompiledTransforms

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def folder(root: Path, count: int = 12) -> Path:
    rng = np.random.default_rng(0)
    lines = ["path,label"]
    for i in range(count):
        shape = (int(rng.integers(20, 60)), int(rng.integers(20, 60)), 3)
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(buffer, "PNG")
        (root / f"{i}.png").write_bytes(buffer.getvalue())
        lines.append(f"{i}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return root / "list.csv"


def batches(source: Path, transform: list, **kwargs) -> list[np.ndarray]:
    loader = Loader(source, 4, transform=transform, shuffle=False, num_threads=1, seed=7, **kwargs)
    return [images.numpy() for images, _ in loader]


SPECS = {
    "rrc first (window decoded), flip, normalize": ([RandomResizedCrop(16), RandomHorizontalFlip()], True),
    "rrc first, normalize": ([RandomResizedCrop(16)], True),
    "rrc after a step (window cropped), flip": ([ColorJitter(0.3), RandomResizedCrop(16), RandomHorizontalFlip(1.0)],
                                                False),
    "fixed resize, normalize": ([Resize((12, 20))], True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_output_equals_uint8_then_normalize(tmp_path: Path, name: str, layout: str) -> None:
    source = folder(tmp_path)
    steps, normalize = SPECS[name]
    fused = batches(source, [*steps, Normalize(MEAN, STD)] if normalize else steps, layout=layout)
    pixels = batches(source, steps, dtype="uint8", layout=layout)
    axis = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
    mean = np.array(MEAN if normalize else (0.0,) * 3, np.float32).reshape(axis) * 255
    std = np.array(STD if normalize else (1.0,) * 3, np.float32).reshape(axis) * 255
    assert len(fused) == len(pixels) == 3
    for f, p in zip(fused, pixels, strict=True):
        assert f.dtype == np.float32 and f.shape == p.shape
        np.testing.assert_allclose(f, (p.astype(np.float32) - mean) / std, rtol=0, atol=2e-6)


def test_the_fusion_applies_where_its_conditions_hold() -> None:
    def fuses(steps: list, **kwargs) -> bool:
        compiled = CompiledTransforms(steps, **kwargs)
        graph = list(enumerate(compiled.steps))
        while graph and isinstance(graph[-1][1], (Normalize, RandomHorizontalFlip)):
            graph.pop()
        return compiled._fuses_resize(graph)  # on either device: the GPU has the resampler too

    assert fuses([RandomResizedCrop(8), RandomHorizontalFlip(), Normalize()])
    assert not fuses([RandomResizedCrop(8)], dtype="uint8")
    assert not fuses([RandomResizedCrop(8)], dtype="float16")
    assert not fuses([Resize((8, 8)), Normalize(), Resize((4, 4))]), "a resize of a float image is DALI's"
    assert not fuses([RandomResizedCrop(8)], channels=1)


@pytest.mark.parametrize(
    "shape, size",
    [((30, 40), (16, 20)), ((30, 20), (16, 20)), ((60, 20), (10, 24)), ((16, 20), (16, 20)), ((16, 30), (16, 20))],
    ids=["rows first", "width kept", "columns first", "same size", "height kept"],
)
@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("chw", [False, True])
def test_resample_normalize_is_resample_then_mirror_then_normalize(shape, size, mirror: bool, chw: bool) -> None:
    from stallfree.transforms.kernels.resample_node import resample, resample_normalize

    image = np.random.default_rng(1).integers(0, 256, (*shape, 3), dtype=np.uint8)
    mean, inv = np.array([120.0, 110.5, 100.25], np.float32), np.array([1 / 58.0, 1 / 57.0, 1 / 57.5], np.float32)
    flags = np.concatenate([mean, inv, np.array([1, chw], np.float32)])
    out = np.empty((3, *size) if chw else (*size, 3), np.float32)
    resample_normalize(out, image, flags, mirror)
    pixels = np.empty((*size, 3), np.uint8)
    resample(pixels, image, True)
    if mirror:
        pixels = pixels[:, ::-1]
    expected = (pixels.astype(np.float32) - mean) * inv
    np.testing.assert_array_equal(out, expected.transpose(2, 0, 1) if chw else expected)
