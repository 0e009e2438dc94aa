"""The one image check takes every format DALI's decoder decodes, and refuses a truncated file of each.

Issue 13, item 6: a WebP folder was accepted at construction and failed at the first batch ("not a JPEG or PNG
image"), with advice to skip. Each file here is written by PIL, as a user's would be.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, features

from stallfree.ingest.images import FORMATS, BadImage, read_header

PIXELS = np.random.default_rng(0).integers(0, 256, (13, 17, 3), np.uint8)


def encoded(fmt: str, mode: str = "RGB", **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(PIXELS).convert(mode).save(out, fmt, **options)
    return out.getvalue()


# (PIL format, options, the check's format name); a format PIL here cannot write is skipped with the reason.
CASES = {
    "webp-lossy": ("WEBP", {"quality": 90}, "webp"),
    "webp-lossless": ("WEBP", {"lossless": True}, "webp"),
    "bmp": ("BMP", {}, "bmp"),
    "tiff": ("TIFF", {}, "tiff"),
    "tiff-lzw": ("TIFF", {"compression": "tiff_lzw"}, "tiff"),
    "jp2": ("JPEG2000", {}, "jpeg2000"),
    "j2k": ("JPEG2000", {"no_jp2": True}, "jpeg2000"),
    "ppm": ("PPM", {}, "pnm"),
}
NEEDS = {"WEBP": "webp", "JPEG2000": "jpg_2000", "TIFF": "libtiff"}


def case(name: str) -> tuple[str, dict[str, object], str]:
    fmt, options, expected = CASES[name]
    if fmt in NEEDS and not features.check(NEEDS[fmt]):
        pytest.skip(f"this PIL was built without {NEEDS[fmt]}")
    return fmt, options, expected


# every format in colour and in grey, but a grayscale bare codestream, which is refused (a test below)
READABLE = [(name, mode) for name in sorted(CASES) for mode in ("RGB", "L") if (name, mode) != ("j2k", "L")]


@pytest.mark.parametrize(("name", "mode"), READABLE)
def test_each_format_is_read_with_its_size(name: str, mode: str) -> None:
    fmt, options, expected = case(name)
    header = read_header(encoded(fmt, mode, **options))
    assert (header.format, header.height, header.width) == (expected, 13, 17)
    assert header.format in FORMATS


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_truncated_file_of_each_format_is_refused(name: str) -> None:
    fmt, options, expected = case(name)
    data = encoded(fmt, **options)
    with pytest.raises(BadImage, match="truncated"):
        read_header(data[: len(data) * 2 // 3])


def test_pgm_and_pbm_and_ascii_pnm() -> None:
    assert read_header(encoded("PPM", "L")).channels == 1
    assert read_header(encoded("PPM", "1")).format == "pnm"  # P4
    assert read_header(b"P3\n# a comment\n2 1\n255\n1 2 3 4 5 6\n").width == 2
    with pytest.raises(BadImage, match="truncated PNM"):
        read_header(b"P3\n2 1\n255\n1 2 3 4\n")


def test_16_bit_depth_is_reported() -> None:
    out = io.BytesIO()
    Image.fromarray(np.full((4, 5), 40000, np.uint16)).save(out, "TIFF")
    assert read_header(out.getvalue()).depth == 16
    assert read_header(b"P5\n2 1\n65535\n" + b"\x00" * 4).depth == 16


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"GIF89a" + b"\x00" * 40, "not an image the Loader decodes: its first bytes match none of JPEG, PNG, WebP"),
        (b"RIFF\x10\x00\x00\x00WEBPVP8X" + b"\x0a\x00\x00\x00\x02" + b"\x00" * 9, "animated WebP"),
    ],
    ids=["gif", "animated-webp"],
)
def test_what_dali_does_not_decode_is_refused_with_the_reason(data: bytes, match: str) -> None:
    with pytest.raises(BadImage, match=match):
        read_header(data)


def test_the_two_files_dalis_decoder_fails_on_are_refused_with_the_fix() -> None:
    # DALI 2.4: "unsupported conversion from 1 components to 3" and "missing: BitsPerSample".
    if not features.check("jpg_2000"):
        pytest.skip("this PIL was built without jpg_2000")
    with pytest.raises(BadImage, match=r"grayscale JPEG 2000 codestream \(.j2k\).*\.jp2"):
        read_header(encoded("JPEG2000", "L", no_jp2=True))
    with pytest.raises(BadImage, match="without a BitsPerSample tag.*tiff_lzw"):
        read_header(encoded("TIFF", "1"))


def test_the_size_limit_holds_for_every_format() -> None:
    with pytest.raises(BadImage, match="more than max_pixels=100"):
        read_header(encoded("BMP"), max_pixels=100)


def test_a_progressive_jpeg_cut_inside_a_later_scan_is_truncated() -> None:
    # The end-of-image check looks for a scan after the last EOI (it used to search backwards for the last scan,
    # across all the entropy-coded data). A progressive JPEG has several scans; cut inside the last one, its
    # only EOI is gone and a scan remains after whatever came before.
    whole = encoded("JPEG", quality=90, progressive=True)
    scans = [i for i in range(len(whole) - 1) if whole[i : i + 2] == b"\xff\xda"]
    assert len(scans) > 1, "PIL wrote a progressive JPEG with several scans"
    assert read_header(whole).format == "jpeg"
    with pytest.raises(BadImage, match="truncated JPEG"):
        read_header(whole[: scans[-1] + 8])
    with pytest.raises(BadImage, match="truncated JPEG"):
        read_header(whole[:-2])  # only the EOI marker cut off
