"""The CPU graph's resampler (transforms/resample.py) against PIL's BILINEAR, which torchvision uses for PIL images."""

import numpy as np
import pytest
from PIL import Image

from stallfree.transforms.resample import resample


@pytest.mark.parametrize(
    ("shape", "out"),
    [
        ((375, 500), (224, 224)),  # an ImageNet-sized image, downscaled (the antialiasing filter widens)
        ((40, 30), (224, 224)),  # upscaled
        ((97, 1203), (7, 300)),  # very different factors per axis
        ((1, 1), (5, 3)),  # a single pixel
        ((300, 2), (1, 1)),  # to a single pixel
    ],
)
def test_resample_equals_pil_bilinear_within_one_level(shape, out) -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    got = np.empty((*out, 3), np.uint8)
    resample(got, image, True)
    ref = np.asarray(Image.fromarray(image).resize(out[::-1], Image.Resampling.BILINEAR))
    assert np.abs(got.astype(np.int16) - ref).max() <= 1


def test_resample_reads_a_strided_window_as_its_crop() -> None:
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
    from_view, from_copy = np.empty((16, 16, 3), np.uint8), np.empty((16, 16, 3), np.uint8)
    resample(from_view, image[5:50, 12:70], True)
    resample(from_copy, image[5:50, 12:70].copy(), True)
    np.testing.assert_array_equal(from_view, from_copy)
