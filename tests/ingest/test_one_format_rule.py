"""One rule for which formats are images: a file list ingested and read back, and read in place, agree sample by sample.

Regression (issue 34, item 8): a CSV list of 7 JPEGs and a GIF ingested with 0 rejections (ingest asked PIL, which
reads GIF, and re-encoded it as PNG) and the Loader over those shards delivered all 8 samples, while
``Loader("list.csv")`` over the same list raised ``BadSampleError: .../x.gif (sample 7): not an image the Loader
decodes: its first bytes match none of JPEG, PNG, ...``. Each case below is one file beside three JPEGs: ingest +
the Loader over its shards, and the Loader over the list, must deliver the same pixels under the same labels, or
both refuse the file with the same reason.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin, features

from stallfree import BadSampleError, Loader
from stallfree.ingest.images import read_header
from stallfree.ingest.runner import ingest
from stallfree.ingest.validate import check_image
from stallfree.ingest.writer import IngestOptions
from stallfree.transforms import CenterCrop

SIZE = (12, 16)
PIXELS = np.random.default_rng(3).integers(0, 256, (*SIZE, 3), np.uint8)


def encoded(fmt: str, mode: str = "RGB", pixels: np.ndarray = PIXELS, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, fmt, **options)
    return out.getvalue()


def animated(fmt: str, **options: object) -> bytes:
    frames = [Image.fromarray(np.roll(PIXELS, k, axis=1)) for k in range(3)]
    out = io.BytesIO()
    frames[0].save(out, fmt, save_all=True, append_images=frames[1:], duration=100, loop=0, **options)
    return out.getvalue()


def sixteen_bit(fmt: str) -> bytes:
    deep = np.random.default_rng(4).integers(0, 65536, SIZE).astype(np.uint16)
    deep[0, 0] = 200  # one sample PIL keeps as it is, beside others it clips
    out = io.BytesIO()
    Image.fromarray(deep).save(out, fmt)  # mode I;16
    return out.getvalue()


def pgm_16_bit() -> bytes:
    deep = np.random.default_rng(5).integers(0, 65536, SIZE).astype(">u2")
    return f"P5\n{SIZE[1]} {SIZE[0]}\n65535\n".encode() + deep.tobytes()


def png_with_a_bad_text_crc() -> bytes:
    """A PNG whose tEXt chunk (before the image data) fails its CRC: PIL refuses to open it, DALI's libpng warns."""
    info = PngImagePlugin.PngInfo()
    info.add_text("title", "x")
    out = io.BytesIO()
    Image.fromarray(PIXELS).save(out, "PNG", pnginfo=info)
    data = bytearray(out.getvalue())
    at = data.find(b"tEXt")
    data[at + 4 + struct.unpack_from(">I", data, at - 4)[0]] ^= 0xFF  # the CRC's first byte
    return bytes(data)


def webp_with_an_odd_image_chunk_then_exif() -> bytes:
    """A lossless WebP with EXIF whose VP8L chunk has an odd size, so that a pad byte comes before the EXIF chunk."""
    tag = Image.Exif()
    tag[0x0112] = 1
    for seed in range(64):
        pixels = np.random.default_rng(seed).integers(0, 256, (*SIZE, 3), np.uint8)
        data = encoded("WEBP", pixels=pixels, lossless=True, exif=tag.tobytes())
        if data[30:34] == b"VP8L" and struct.unpack_from("<I", data, 34)[0] & 1:  # after RIFF, WEBP and VP8X
            return data
    raise AssertionError("no seed gave a VP8L chunk of an odd size")


# name: (file name, its bytes, whether both deliver it, the PIL feature it needs)
CASES: dict[str, tuple[str, Callable[[], bytes], bool, str | None]] = {
    "gif": ("x.gif", lambda: encoded("GIF"), False, None),
    "animated-gif": ("x.gif", lambda: animated("GIF"), False, None),
    "animated-webp": ("x.webp", lambda: animated("WEBP", lossless=True), False, "webp"),
    "ico": ("x.ico", lambda: encoded("ICO"), False, None),
    "tiff-1-bit-uncompressed": ("x.tif", lambda: encoded("TIFF", "1"), False, None),
    "png-bad-text-crc": ("x.png", png_with_a_bad_text_crc, False, None),
    "webp": ("x.webp", lambda: encoded("WEBP", lossless=True), True, "webp"),
    "webp-odd-chunk-then-exif": ("x.webp", webp_with_an_odd_image_chunk_then_exif, True, "webp"),
    "png-16-bit": ("x.png", lambda: sixteen_bit("PNG"), True, None),
    "jpeg-cmyk": ("x.jpg", lambda: encoded("JPEG", "CMYK", quality=95), True, None),
    "jpeg-gray": ("x.jpg", lambda: encoded("JPEG", "L"), True, None),
    "bmp-palette": ("x.bmp", lambda: encoded("BMP", "P"), True, None),
    "ppm": ("x.ppm", lambda: encoded("PPM"), True, None),
    "pgm-16-bit": ("x.pgm", pgm_16_bit, True, None),
    "tiff-lzw": ("x.tif", lambda: encoded("TIFF", compression="tiff_lzw"), True, "libtiff"),
    "tiff-16-bit": ("x.tif", lambda: sixteen_bit("TIFF"), True, None),
    "jp2": ("x.jp2", lambda: encoded("JPEG2000"), True, "jpg_2000"),
}


def write_list(root: Path, odd: tuple[str, bytes], jpegs: int = 3) -> Path:
    """``jpegs`` JPEGs, then the odd file, each labelled with its row."""
    root.mkdir()
    names = []
    for i in range(jpegs):
        (root / f"{i}.jpg").write_bytes(encoded("JPEG", pixels=np.roll(PIXELS, i, axis=0), quality=90))
        names.append(f"{i}.jpg")
    (root / odd[0]).write_bytes(odd[1])
    names.append(odd[0])
    listing = root / "list.csv"
    listing.write_text("path,label\n" + "".join(f"{name},{row}\n" for row, name in enumerate(names)))
    return listing


def read(source: Path, on_error: str = "skip") -> tuple[dict[int, np.ndarray], dict[str, str]]:
    """What a Loader over ``source`` delivers (pixels by label) and what it skips (reason by file name)."""
    loader = Loader(source, batch_size=2, transform=[CenterCrop(SIZE)], shuffle=False, dtype="uint8",
                    layout="NHWC", num_threads=1, on_error=on_error)  # type: ignore[arg-type]
    delivered: dict[int, np.ndarray] = {}
    for images, labels in loader:
        for image, label in zip(images.numpy(), labels.tolist(), strict=True):
            delivered.setdefault(int(label), image)  # a skipped sample's place is filled by another, seen again
    return delivered, {Path(s["source"]).name: s["reason"] for s in loader.skipped}


def ingested(listing: Path, out: Path, options: IngestOptions = IngestOptions()) -> dict[str, str]:  # noqa: B008
    """Ingest ``listing`` into ``out``; what it rejected (reason by file name)."""
    ingest(listing, out, options)
    lines = (out / "rejected.jsonl").read_text().splitlines()
    return {Path(r["path"]).name: r["reason"] for r in map(json.loads, lines)}


def assert_agree(listing: Path, out: Path) -> tuple[dict[int, np.ndarray], dict[str, str]]:
    """Ingest + the Loader over the shards, and the Loader in place, deliver and refuse alike; what they do."""
    rejected = ingested(listing, out)
    from_shards, skipped_in_shards = read(out)
    in_place, skipped_in_place = read(listing)
    assert skipped_in_shards == {}
    assert rejected == skipped_in_place
    assert sorted(from_shards) == sorted(in_place)
    for label, image in in_place.items():
        np.testing.assert_array_equal(from_shards[label], image, err_msg=f"label {label}")
    return in_place, rejected


def test_a_list_of_jpegs_and_a_gif_is_read_alike_in_place_and_from_shards(tmp_path: Path) -> None:
    listing = write_list(tmp_path / "src", ("x.gif", encoded("GIF")), jpegs=7)
    with pytest.raises(BadSampleError, match=r"x\.gif \(sample 7\): not an image the Loader decodes.*GIF"):
        read(listing, on_error="raise")
    delivered, rejected = assert_agree(listing, tmp_path / "out")
    assert sorted(delivered) == list(range(7))
    assert list(rejected) == ["x.gif"]


# Disagreements left to the part that owns them, each a strict xfail so that its fix is noticed.
KNOWN = {
    # DALI 2.4's WebP parser (nvImageCodec) fails on the pad byte after an odd-sized image chunk ("Could not
    # retrieve image info from webp stream - Unexpected end of stream"), so the Loader skips a valid WebP as
    # "decoding failed" that ingest, decoding it with PIL, takes. The fix belongs to the graph (pipeline/graph.py),
    # which could hand such a WebP to PIL on the host as it does 16-bit images.
    "webp-odd-chunk-then-exif": pytest.mark.xfail(strict=True, reason="DALI fails on a valid WebP; see KNOWN"),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=KNOWN[c]) if c in KNOWN else c for c in sorted(CASES)])
def test_each_format_is_delivered_or_refused_alike(tmp_path: Path, case: str) -> None:
    name, make, delivers, needs = CASES[case]
    if needs is not None and not features.check(needs):
        pytest.skip(f"this PIL was built without {needs}")
    try:
        data = make()
    except (OSError, ValueError, KeyError) as err:
        pytest.skip(f"this PIL cannot write {case}: {err}")
    delivered, rejected = assert_agree(write_list(tmp_path / "src", (name, data)), tmp_path / "out")
    if delivers:
        assert sorted(delivered) == [0, 1, 2, 3] and rejected == {}
    else:
        assert sorted(delivered) == [0, 1, 2] and list(rejected) == [name]


@pytest.mark.parametrize(
    "options", [IngestOptions(max_side=8), IngestOptions(raw=(6, 8))], ids=["max-side", "raw"]
)
def test_a_re_encoding_ingest_refuses_a_gif_as_the_loader_does(tmp_path: Path, options: IngestOptions) -> None:
    # Ingest could decode the GIF with PIL and store a JPEG or raw pixels the Loader reads, but whether a format is
    # an image does not depend on the options: one folder must not be taken with --max-side and refused without it.
    listing = write_list(tmp_path / "src", ("x.gif", encoded("GIF")))
    _, skipped = read(listing)
    assert ingested(listing, tmp_path / "out", options) == skipped
    assert list(skipped) == ["x.gif"]


def test_a_header_under_max_pixels_is_no_bomb_to_ingest() -> None:
    # Ingest turned PIL's DecompressionBombWarning (at 89,478,485 pixels, half PIL's error threshold) into a
    # rejection, "decompression bomb: Image size (100000000 pixels) exceeds limit of 89478485 pixels", of a header
    # the Loader takes under the max_pixels both default to (178,956,970): max_pixels is the one limit.
    data = bytearray(encoded("PNG"))
    struct.pack_into(">II", data, 16, 10_000, 10_000)  # IHDR's width and height
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))  # and its CRC, which PIL checks
    assert read_header(bytes(data)).height == check_image(bytes(data)).height == 10_000
