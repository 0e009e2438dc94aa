"""16-bit PNGs decode as PIL's ``convert("RGB")`` does, pixel for pixel.

PIL clips a 16-bit grayscale PNG ("I;16") to 0..255 and keeps the high byte of 16-bit RGB/RGBA/LA samples; DALI's
decoder scales every 16-bit sample to 8 bits with rounding (254 levels from PIL for gray, one for colour). The
graph's host stage hands every 16-bit PNG to PIL, so both placements give PIL's pixels.
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from stallfree import Loader
from stallfree.transforms import CenterCrop, RandomResizedCrop

# PNG colour types: 0 gray, 2 RGB, 4 gray + alpha, 6 RGBA.
CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png16(colour: int, seed: int = 0, size: tuple[int, int] = (20, 24), orientation: int | None = None) -> bytes:
    """A 16-bit PNG (height, width) = ``size`` with samples over the whole 0..65535 range, written by hand."""
    height, width = size
    samples = np.random.default_rng(seed).integers(0, 65536, (height, width, CHANNELS[colour])).astype(">u2")
    samples[0, 0] = 200  # under 256: PIL keeps it for gray, DALI makes it 1
    rows = b"".join(b"\x00" + samples[y].tobytes() for y in range(height))
    body = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, colour, 0, 0, 0))
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        body += chunk(b"eXIf", exif.tobytes()[6:])  # without the "Exif\0\0" prefix, as the PNG spec has it
    return b"\x89PNG\r\n\x1a\n" + body + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def pil(data: bytes, exif: str = "ignore") -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    return np.asarray((ImageOps.exif_transpose(image) if exif == "apply" else image).convert("RGB"))


def decode(tmp_path: Path, items: list[bytes], size: tuple[int, int], exif: str = "ignore") -> list[np.ndarray]:
    (tmp_path / "a").mkdir(exist_ok=True)
    for i, data in enumerate(items):
        (tmp_path / "a" / f"{i}.png").write_bytes(data)
    loader = Loader(tmp_path, batch_size=len(items), transform=[CenterCrop(size)], shuffle=False, dtype="uint8",
                    layout="NHWC", num_threads=1, exif=exif)  # type: ignore[arg-type]
    (images, _), = list(loader)
    return list(images.numpy())


def test_a_16_bit_grayscale_png_is_clipped_as_pil_does(tmp_path: Path) -> None:
    data = png16(0)
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    (image,) = decode(tmp_path, [data], (20, 24))
    reference = pil(data)
    assert reference[0, 0].tolist() == [200] * 3 and (reference == 255).mean() > 0.9
    np.testing.assert_array_equal(image, reference)


@pytest.mark.parametrize("colour", [2, 4, 6], ids=["rgb", "gray-alpha", "rgba"])
def test_16_bit_colour_and_alpha_pngs_keep_pils_high_byte(tmp_path: Path, colour: int) -> None:
    data = png16(colour, seed=colour)
    (image,) = decode(tmp_path, [data], (20, 24))
    np.testing.assert_array_equal(image, pil(data))


def test_16_bit_and_8_bit_pngs_in_one_batch(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(buffer, "PNG")
    items = [png16(0), buffer.getvalue(), png16(2, seed=1)]
    for image, data in zip(decode(tmp_path, items, (20, 24)), items, strict=True):
        np.testing.assert_array_equal(image, pil(data))


def test_a_16_bit_png_keeps_its_orientation_under_apply(tmp_path: Path) -> None:
    data = png16(0, orientation=6)
    (image,) = decode(tmp_path, [data], (24, 20), exif="apply")
    np.testing.assert_array_equal(image, pil(data, "apply"))


def test_a_16_bit_png_through_a_region_of_interest_decode(tmp_path: Path) -> None:
    # RandomResizedCrop first decodes only its window; the host stage runs before it, whatever the first step.
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.png").write_bytes(png16(0, size=(40, 40)))
    loader = Loader(tmp_path, batch_size=1, transform=[RandomResizedCrop(40, scale=(1.0, 1.0), ratio=(1.0, 1.0))],
                    dtype="uint8", layout="NHWC", num_threads=1)
    (images, _), = list(loader)
    np.testing.assert_array_equal(images[0].numpy(), pil(png16(0, size=(40, 40))))


@pytest.mark.gpu
def test_a_16_bit_png_on_the_gpu(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.png").write_bytes(png16(0))
    loader = Loader(tmp_path, batch_size=1, transform=[CenterCrop((20, 24))], dtype="uint8", layout="NHWC",
                    num_threads=1, device="cuda")
    (images, _), = list(loader)
    np.testing.assert_array_equal(images[0].cpu().numpy(), pil(png16(0)))
