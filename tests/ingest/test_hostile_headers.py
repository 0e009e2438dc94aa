"""Hostile image headers: every one is the one check's own "bad image", named, for ingest and the Loader alike.

Regression (issue 37, case 10): a 4-byte TIFF (``struct.error: unpack_from requires a buffer of at least 8
bytes``), a TIFF whose ImageWidth has count 0 (``IndexError: list index out of range``) and a JPEG 2000 codestream
with YOsiz > Ysiz (``ValueError: math domain error``, from the crop drawn on a negative height) ended the epoch with
a traceback naming no file, even with ``on_error="skip"``; a ZSTD TIFF whose strips PIL cannot decode was
delivered by DALI as a black image.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, features

from stallfree import BadSampleError, Loader
from stallfree.ingest.images import BadImage, read_header
from stallfree.ingest.runner import ingest
from stallfree.ingest.validate import Rejected, check_image
from stallfree.transforms import RandomResizedCrop

PIXELS = np.random.default_rng(0).integers(0, 256, (10, 12, 3), np.uint8)


def encoded(fmt: str, mode: str = "RGB", **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(PIXELS).convert(mode).save(out, fmt, **options)
    return out.getvalue()


def tiff_with(tag: int, *, count: int | None = None, value: int | None = None) -> bytes:
    """An uncompressed little-endian TIFF (as PIL writes it) whose ``tag`` entry says ``count`` or ``value``."""
    data = bytearray(encoded("TIFF"))
    (ifd,) = struct.unpack_from("<I", data, 4)
    (entries,) = struct.unpack_from("<H", data, ifd)
    for entry in range(ifd + 2, ifd + 2 + 12 * entries, 12):
        if struct.unpack_from("<H", data, entry)[0] == tag:
            if count is not None:
                struct.pack_into("<I", data, entry + 4, count)
            if value is not None:
                struct.pack_into("<H", data, entry + 8, value)
            return bytes(data)
    raise AssertionError(f"PIL wrote no tag {tag}")


def j2k_offset_beyond_size() -> bytes:
    """A bare JPEG 2000 codestream whose SIZ segment puts the image's top (YOsiz) below its bottom (Ysiz)."""
    data = bytearray(encoded("JPEG2000", no_jp2=True))
    (height,) = struct.unpack_from(">I", data, 12)  # SOC, SIZ marker, Lsiz, Rsiz, Xsiz, then Ysiz
    struct.pack_into(">I", data, 20, height + 5)  # YOsiz
    return bytes(data)


HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "tiff-4-bytes": (lambda: b"II*\x00", "truncated TIFF"),
    "tiff-width-count-0": (lambda: tiff_with(256, count=0), "corrupt TIFF: tag 256 has no values"),
    "tiff-zstd": (lambda: tiff_with(259, value=50000), r"TIFF compressed with ZSTD \(50000\).*tiff_lzw"),
    "j2k-yosiz-beyond-ysiz": (j2k_offset_beyond_size, "corrupt JPEG 2000: .*offset"),
    "jp2-box-cut-in-its-length": (lambda: b"\x00\x00\x00\x0cjP  \r\n\x87\n" + b"\x00\x00\x00\x01jp2c\x00",
                                  "truncated JPEG 2000"),
}


def hostile(name: str) -> bytes:
    if name.startswith("j2k") and not features.check("jpg_2000"):
        pytest.skip("this PIL was built without jpg_2000")
    return HOSTILE[name][0]()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_header_is_a_bad_image(name: str) -> None:
    with pytest.raises(BadImage, match=HOSTILE[name][1]):
        read_header(hostile(name))


def _mutants(data: bytes, rng: np.random.Generator, count: int) -> list[bytes]:
    """Every cut of the first 160 bytes, and ``count`` copies with 1-4 header bytes set to 0, 0xFF or at random."""
    out = [data[:cut] for cut in range(min(len(data), 160))]
    for _ in range(count):
        copy = bytearray(data)
        for at in rng.integers(0, min(len(data), 96), rng.integers(1, 5)):
            copy[at] = int(rng.choice([0, 0xFF, rng.integers(0, 256)]))
        out.append(bytes(copy))
    return out


FORMATS = {
    "jpeg": ("JPEG", {}), "png": ("PNG", {}), "webp": ("WEBP", {"lossless": True}), "bmp": ("BMP", {}),
    "tiff": ("TIFF", {}), "tiff-lzw": ("TIFF", {"compression": "tiff_lzw"}), "jp2": ("JPEG2000", {}),
    "j2k": ("JPEG2000", {"no_jp2": True}), "ppm": ("PPM", {}),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_damaged_header_of_any_format_is_a_header_or_a_bad_image(name: str) -> None:
    fmt, options = FORMATS[name]
    if fmt in ("WEBP", "JPEG2000") and not features.check({"WEBP": "webp", "JPEG2000": "jpg_2000"}[fmt]):
        pytest.skip(f"this PIL cannot write {fmt}")
    for data in _mutants(encoded(fmt, **options), np.random.default_rng(len(name)), 600):
        try:
            header = read_header(data, exif="apply")
        except BadImage:
            continue
        # What the crop windows are drawn on: anything else is a bad image too.
        assert header.height > 0 and header.width > 0 and header.channels > 0, header


def test_ingest_refuses_a_zstd_tiff_with_the_loaders_reason() -> None:
    data = hostile("tiff-zstd")
    with pytest.raises(BadImage) as loader_says:
        read_header(data)
    with pytest.raises(Rejected) as ingest_says:
        check_image(data)
    assert ingest_says.value.reason == loader_says.value.reason


def _listing(root: Path) -> tuple[Path, list[str]]:
    """Six good PNGs, then each hostile file, labelled by their row; and the hostile files' names."""
    root.mkdir()
    names = [f"{i:02d}.png" for i in range(6)] + [f"{name}.img" for name in sorted(HOSTILE)]
    for name in names[:6]:
        (root / name).write_bytes(encoded("PNG"))
    for name in sorted(HOSTILE):
        (root / f"{name}.img").write_bytes(hostile(name))
    (root / "list.csv").write_text("path,label\n" + "".join(f"{n},{i}\n" for i, n in enumerate(names)))
    return root / "list.csv", names[6:]


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_the_loader_skips_or_names_each_hostile_file(tmp_path: Path, on_error: str) -> None:
    source, bad = _listing(tmp_path / "data")
    # RandomResizedCrop draws its window on the header's size (the math domain error came from there).
    loader = Loader(source, 4, transform=[RandomResizedCrop(8)], shuffle=False, dtype="uint8", num_threads=1,
                    on_error=on_error)
    if on_error == "raise":
        with pytest.raises(BadSampleError, match=rf"{bad[0]} \(sample 6\): "):
            list(loader)
        return
    batches = list(loader)
    assert [len(labels) for _, labels in batches] == [4, 4, 3], "each hostile file replaced by a good one"
    assert sorted(Path(s["source"]).name for s in loader.skipped) == sorted(bad)
    assert all(int(labels.max()) < 6 for _, labels in batches)


def test_ingest_rejects_each_hostile_file_by_name(tmp_path: Path) -> None:
    source, bad = _listing(tmp_path / "data")
    summary = ingest(source, tmp_path / "out")
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert summary["rejected"] == len(bad), rejected
    assert sorted(Path(r["path"]).name for r in rejected) == sorted(bad)


@pytest.mark.parametrize(("compression", "taken"), [
    ("raw", True), ("tiff_lzw", True), ("tiff_adobe_deflate", True), ("packbits", True), ("jpeg", True),
    ("group4", True), ("zstd", False), ("lzma", False),
])
def test_a_tiff_is_taken_by_its_compression(compression: str, taken: bool) -> None:
    # Those taken decode to PIL's pixels in DALI 2.4; LZMA fails there, ZSTD is not in every PIL.
    try:
        data = encoded("TIFF", "1" if compression == "group4" else "RGB", compression=compression)
    except (OSError, ValueError) as err:
        pytest.skip(f"this PIL cannot write {compression}: {err}")
    if taken:
        assert read_header(data).format == "tiff"
        return
    with pytest.raises(BadImage, match=r"TIFF compressed with (ZSTD|LZMA) \(\d+\)"):
        read_header(data)
