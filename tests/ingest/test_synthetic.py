"""The bench data generator: what its natural style makes, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from stallfree.ingest.synthetic import make_image_folder


def _spectrum_slope(gray: np.ndarray) -> float:
    """The log-log slope of the radially averaged amplitude spectrum, over mid frequencies."""
    amplitude = np.abs(np.fft.fft2(gray - gray.mean()))
    fy, fx = np.meshgrid(np.fft.fftfreq(gray.shape[0]), np.fft.fftfreq(gray.shape[1]), indexing="ij")
    f = np.hypot(fx, fy)
    band = (f > 0.02) & (f < 0.25)
    slope, _ = np.polyfit(np.log(f[band]), np.log(amplitude[band]), 1)
    return float(slope)


def test_natural_style_has_a_photographs_spectrum_and_size(tmp_path):
    root = make_image_folder(tmp_path, num_classes=2, per_class=3, size=(375, 500), style="natural")
    files = sorted(root.glob("*/*.jpg"))
    assert len(files) == 6
    sizes_kib = [f.stat().st_size / 1024 for f in files]
    assert 40 < np.mean(sizes_kib) < 120  # an ImageNet photo is about 110 KiB at its size, ~70 at 0.19 MP
    slopes = [_spectrum_slope(np.asarray(Image.open(f).convert("L"), dtype=np.float64)) for f in files]
    assert all(-1.6 < s < -0.9 for s in slopes), slopes  # photographs: about -0.8 to -1.5


def test_same_seed_same_bytes_and_bad_style_named(tmp_path):
    a = make_image_folder(tmp_path / "a", num_classes=1, per_class=2, size=(40, 48), style="natural")
    b = make_image_folder(tmp_path / "b", num_classes=1, per_class=2, size=(40, 48), style="natural")
    assert [f.read_bytes() for f in sorted(a.glob("*/*.jpg"))] == [f.read_bytes() for f in sorted(b.glob("*/*.jpg"))]
    with pytest.raises(ValueError, match="style must be one of shapes, natural, got 'photo'"):
        make_image_folder(tmp_path / "c", style="photo")
