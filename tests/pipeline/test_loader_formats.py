"""A folder or file list of any format DALI decodes gives PIL's ``convert("RGB")`` pixels; others are refused by name.

Issue 13, item 6: a WebP folder was accepted at construction and failed at the first batch with "not a JPEG or
PNG image" and advice to skip.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps, features

from stallfree import BadSampleError, Loader
from stallfree.transforms import CenterCrop

PIXELS = np.random.default_rng(1).integers(0, 256, (12, 16, 3), np.uint8)
# file name, PIL format, mode, options
FILES = [
    ("a.webp", "WEBP", "RGB", {"quality": 90}),
    ("b.webp", "WEBP", "RGBA", {"lossless": True}),
    ("c.bmp", "BMP", "RGB", {}),
    ("d.bmp", "BMP", "P", {}),
    ("e.tif", "TIFF", "RGB", {"compression": "tiff_lzw"}),
    ("f.tiff", "TIFF", "L", {}),
    ("g.ppm", "PPM", "RGB", {}),
    ("h.pgm", "PPM", "L", {}),
    ("i.png", "PNG", "RGB", {}),
]
NEEDS = {"WEBP": "webp", "JPEG2000": "jpg_2000", "TIFF": "libtiff"}


def encoded(fmt: str, mode: str, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(PIXELS).convert(mode).save(out, fmt, **options)
    return out.getvalue()


def pil(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def batch(source: Path, n: int) -> np.ndarray:
    loader = Loader(source, batch_size=n, transform=[CenterCrop((12, 16))], shuffle=False, dtype="uint8",
                    layout="NHWC", num_threads=1)
    (images, _), = list(loader)
    return images.numpy()


def test_an_image_folder_of_every_format_decodes_as_pil_does(tmp_path: Path) -> None:
    files = [f for f in FILES if f[1] not in NEEDS or features.check(NEEDS[f[1]])]
    for name, fmt, mode, options in files:
        (tmp_path / "cls").mkdir(exist_ok=True)
        (tmp_path / "cls" / name).write_bytes(encoded(fmt, mode, **options))
    images = batch(tmp_path, len(files))
    for image, (name, *_) in zip(images, files, strict=True):
        reference = pil(tmp_path / "cls" / name)
        # Lossy WebP decodes through the same libwebp in both; palette images through their palette.
        np.testing.assert_array_equal(image, reference, err_msg=name)


def test_a_file_list_of_jpeg_2000_and_a_16_bit_pgm(tmp_path: Path) -> None:
    if not features.check("jpg_2000"):
        pytest.skip("this PIL was built without jpg_2000: JPEG 2000 untested here")
    (tmp_path / "a.jp2").write_bytes(encoded("JPEG2000", "RGB"))
    (tmp_path / "b.j2k").write_bytes(encoded("JPEG2000", "RGB", no_jp2=True))
    # 16 bits per sample: DALI scales to 8 bits, PIL clips; the graph hands it to PIL (as a 16-bit PNG)
    deep = np.random.default_rng(2).integers(0, 65536, (12, 16)).astype(">u2")
    deep[0, 0] = 200
    (tmp_path / "c.pgm").write_bytes(b"P5\n16 12\n65535\n" + deep.tobytes())
    (tmp_path / "list.csv").write_text("path,label\na.jp2,0\nb.j2k,1\nc.pgm,2\n")
    images = batch(tmp_path / "list.csv", 3)
    for image, name in zip(images, ["a.jp2", "b.j2k", "c.pgm"], strict=True):
        np.testing.assert_array_equal(image, pil(tmp_path / name), err_msg=name)
    assert images[2][0, 0].tolist() == [200] * 3


def test_a_format_dali_does_not_decode_is_refused_naming_the_file(tmp_path: Path) -> None:
    Image.fromarray(PIXELS).save(tmp_path / "x.gif", "GIF")
    (tmp_path / "y.png").write_bytes(encoded("PNG", "RGB"))
    (tmp_path / "list.csv").write_text("path,label\ny.png,0\nx.gif,1\n")
    loader = Loader(tmp_path / "list.csv", batch_size=2, transform=[CenterCrop(8)], shuffle=False, num_threads=1)
    with pytest.raises(BadSampleError, match=r"x\.gif.*not an image the Loader decodes.*WebP, BMP, TIFF"):
        list(loader)


@pytest.mark.parametrize(("fmt", "name"), [("WEBP", "x.webp"), ("TIFF", "x.tif")])
@pytest.mark.parametrize("exif", ["ignore", "apply"])
def test_webp_and_tiff_orientation_under_both_exif_modes(tmp_path: Path, fmt: str, name: str, exif: str) -> None:
    if not features.check(NEEDS[fmt]):
        pytest.skip(f"this PIL was built without {NEEDS[fmt]}")
    tag = Image.Exif()
    tag[0x0112] = 6  # a quarter turn: the displayed image is 16 high, 12 wide
    (tmp_path / "cls").mkdir()
    Image.fromarray(PIXELS).save(tmp_path / "cls" / name, fmt, exif=tag.tobytes(),
                                 **({"lossless": True} if fmt == "WEBP" else {}))
    image = Image.open(tmp_path / "cls" / name)
    reference = np.asarray((ImageOps.exif_transpose(image) if exif == "apply" else image).convert("RGB"))
    size = reference.shape[:2]
    loader = Loader(tmp_path, batch_size=1, transform=[CenterCrop(size)], dtype="uint8", layout="NHWC",
                    num_threads=1, exif=exif)  # type: ignore[arg-type]
    (images, _), = list(loader)
    np.testing.assert_array_equal(images[0].numpy(), reference)
