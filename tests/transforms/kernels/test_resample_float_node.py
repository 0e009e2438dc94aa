"""The float resampler (a resize after Normalize) as a DALI CPU node: PIL's filters in float, torch's pixels.

torchvision resizes a float tensor with torch's antialiased ``interpolate``, which follows PIL's algorithm;
``resize_float_node`` computes the same filters with float32 weights and float64 sums, so it stays within float32
rounding of torch (DALI's ``fn.resize``, the float path before it, differs by up to 22 levels where an axis shrinks,
test_resample_float.py). The GPU kernel gives these pixels to the bit (test_resample_cudasim.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from stallfree.transforms.kernels.filters import FILTERS
from stallfree.transforms.kernels.resample import resample_float
from stallfree.transforms.kernels.resample_node import resize_float_node
from stallfree.transforms.spec import size_input

SHAPES = [((37, 53), (20, 71)), ((64, 40), (64, 13)), ((9, 9), (30, 17)), ((80, 31), (11, 31))]


def _run(images: list[np.ndarray], sizes: list[tuple[int, int]], windows: list[np.ndarray] | None,
         kind: int) -> list[np.ndarray]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None, exec_dynamic=True)
    def pipe() -> Any:
        image = fn.external_source(name="images", dtype=types.FLOAT, layout="HWC")
        size = fn.external_source(name="sizes", dtype=types.UINT8)
        window = None if windows is None else fn.external_source(name="windows", dtype=types.FLOAT)
        return resize_float_node(image, size, window=window, kind=kind)

    p = pipe()
    p.build()
    p.feed_input("images", images)
    p.feed_input("sizes", [size_input(s) for s in sizes])
    if windows is not None:
        p.feed_input("windows", windows)
    (out,) = p.run()
    return [np.array(out[i]) for i in range(len(images))]


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_the_float_resize_is_torchs_antialiased_interpolate_to_float_rounding(interpolation: str) -> None:
    rng = np.random.default_rng(3)
    images = [rng.random((*shape, 3), np.float32) for shape, _ in SHAPES]
    outs = _run(images, [size for _, size in SHAPES], None, FILTERS[interpolation])
    for image, out, (_, size) in zip(images, outs, SHAPES, strict=True):
        t = torch.from_numpy(image).permute(2, 0, 1)[None]
        ref = torch.nn.functional.interpolate(t, size=size, mode=interpolation, antialias=True, align_corners=False)
        assert out.shape == (*size, 3)
        assert np.abs(out - ref[0].permute(1, 2, 0).numpy()).max() * 255 < 0.01


@pytest.mark.parametrize("interpolation", list(FILTERS))
def test_the_float_node_crops_its_window_then_resizes_as_the_kernel(interpolation: str) -> None:
    rng = np.random.default_rng(4)
    images = [rng.normal(0, 1, (*shape, 3)).astype(np.float32) for shape, _ in SHAPES]
    windows = [np.array([2, 3, shape[0] - 4, shape[1] - 5], np.float32) for shape, _ in SHAPES]
    outs = _run(images, [size for _, size in SHAPES], windows, FILTERS[interpolation])
    for image, window, out, (_, size) in zip(images, windows, outs, SHAPES, strict=True):
        top, left, height, width = (int(v) for v in window)
        expected = np.zeros((*size, 3), np.float32)
        resample_float(expected, image[top : top + height, left : left + width], True, FILTERS[interpolation])
        np.testing.assert_array_equal(out, expected)
