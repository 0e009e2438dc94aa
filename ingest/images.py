"""The one image check: what a complete, safe JPEG or PNG is, for ingest and for the Loader alike.

DALI cannot skip a sample that fails inside a running pipeline (NVIDIA/DALI#3913), so the Loader's reader stage
looks at every image first, and ingest applies the same rule before an image goes into a shard (so that what
ingest accepts the Loader reads back): its format, its size (the random crop window needs it, and a
decompression bomb is refused here), its channel count, and whether it is complete. A JPEG is complete when an
end-of-image marker follows its last start-of-scan (entropy-coded data stuffs every 0xFF, so neither marker
occurs inside it; an EXIF thumbnail's markers sit inside an APP1 segment, which is skipped by its length). A PNG
is complete when its IEND chunk is at the end, or followed by at most 64 bytes of trailing data (which PIL and
DALI's decoders ignore). Headers are parsed without decoding, in a few microseconds.

EXIF orientation: by default (``exif="ignore"``) the size is the stored one, as PIL's ``Image.open`` reports it and
as the graph decodes it (DALI's ``adjust_orientation=False``). With ``exif="apply"`` the orientation tag is read
(a JPEG's first ``Exif`` APP1 segment, a PNG's ``eXIf`` chunk) and orientations 5-8, a quarter turn, swap height
and width: the displayed size, which ``ImageOps.exif_transpose`` gives and the graph decodes, so that crop windows
are drawn on it. Values outside 1-8 turn nothing, as in PIL and DALI.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["DEFAULT_MAX_PIXELS", "EXIF_MODES", "BadImage", "Exif", "ImageHeader", "read_header"]

#: What a Loader does with an image's EXIF orientation (see the module docstring).
EXIF_MODES = ("ignore", "apply")
Exif = Literal["ignore", "apply"]

#: The default ``max_pixels`` (PIL's decompression-bomb error threshold), for ingest and the Loader.
DEFAULT_MAX_PIXELS = 178_956_970
#: Trailing bytes a PNG may carry after its IEND chunk.
PNG_TRAILING_LIMIT = 64

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers: C0-CF except DHT (C4), JPG (C8) and DAC (CC).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class BadImage(ValueError):
    """An image the graph must not see; ``reason`` says what is wrong with it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ImageHeader:
    """What the header says: ``format`` ("jpeg" or "png"), ``height``, ``width``, ``channels``.

    ``orientation`` is the EXIF orientation (1 when absent, or when it was not read: ``exif="ignore"``);
    ``height`` and ``width`` are the displayed size when it was applied, else the stored size.
    """

    format: str
    height: int
    width: int
    channels: int
    orientation: int = 1


_EXIF_ORIENTATION = 0x0112


def _tiff_orientation(tiff: bytes) -> int:
    """The orientation tag of a TIFF structure's first IFD (EXIF's layout), 1 when absent or unreadable."""
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for entry in range(ifd + 2, min(ifd + 2 + 12 * count, len(tiff) - 11), 12):
        tag, kind = struct.unpack_from(order + "HH", tiff, entry)
        if tag == _EXIF_ORIENTATION:
            if kind == 3:  # SHORT
                return int(struct.unpack_from(order + "H", tiff, entry + 8)[0])
            if kind == 4:  # LONG
                return int(struct.unpack_from(order + "I", tiff, entry + 8)[0])
            return 1
    return 1


def _jpeg(data: bytes, exif: bool) -> ImageHeader:
    pos, n = 2, len(data)
    frame: tuple[int, int, int] | None = None  # height, width, channels
    orientation = 0  # 0: no Exif segment seen yet (PIL and DALI take the first one)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            raise BadImage(f"corrupt JPEG: expected a marker at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        if length < 2 or pos + 2 + length > n:
            raise BadImage("truncated JPEG (a header segment runs past the end of the file)")
        if marker in _SOF_MARKERS:
            if length < 8:
                raise BadImage("corrupt JPEG: start-of-frame segment too short")
            height, width = struct.unpack_from(">HH", data, pos + 5)
            frame = (height, width, data[pos + 9])
        elif exif and marker == 0xE1 and not orientation and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            orientation = _tiff_orientation(data[pos + 10 : pos + 2 + length])
        elif marker == 0xDA:  # start of scan: the entropy-coded data follows; it must end with EOI
            if frame is None:
                raise BadImage("corrupt JPEG: scan data before any frame header")
            if data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda"):
                raise BadImage("truncated JPEG (no end-of-image marker after the scan data)")
            return ImageHeader("jpeg", *frame, orientation or 1)
        pos += 2 + length
    raise BadImage("truncated JPEG (the file ends before the image data)")


def _png_orientation(data: bytes) -> int:
    """The orientation in a PNG's eXIf chunk (before or after the image data: PIL and DALI read both)."""
    pos, n = 8, len(data)
    while pos + 8 <= n:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"eXIf":
            tiff = data[pos + 8 : pos + 8 + length]
            return _tiff_orientation(tiff[6:] if tiff.startswith(b"Exif\x00\x00") else tiff)
        if kind == b"IEND":
            break
        pos += 12 + length
    return 1


def _png(data: bytes, exif: bool) -> ImageHeader:
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise BadImage("truncated PNG (no IHDR chunk)")
    width, height, _depth, colour = struct.unpack_from(">IIBB", data, 16)
    # IEND: zero length, the type, a 4-byte CRC; then at most PNG_TRAILING_LIMIT bytes of anything
    if data.rfind(b"\x00\x00\x00\x00IEND", max(0, len(data) - 12 - PNG_TRAILING_LIMIT)) < 0:
        raise BadImage(f"truncated PNG (no IEND chunk at the end, or more than {PNG_TRAILING_LIMIT} bytes after it)")
    channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(colour)
    if channels is None:
        raise BadImage(f"corrupt PNG: colour type {colour}")
    return ImageHeader("png", height, width, channels, _png_orientation(data) if exif else 1)


def read_header(
    data: bytes | memoryview | np.ndarray, max_pixels: int = DEFAULT_MAX_PIXELS, *, exif: Exif = "ignore"
) -> ImageHeader:
    """Parse and check an encoded image's header; with ``exif="apply"`` report the displayed (EXIF-turned) size.

    Raises:
        BadImage: for empty data, a format other than JPEG or PNG, a truncated or corrupt header, a zero size, or
            more than ``max_pixels`` pixels.
    """
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    if not raw:
        raise BadImage("empty file")
    if raw[:3] == b"\xff\xd8\xff":
        header = _jpeg(raw, exif == "apply")
    elif raw[:8] == _PNG_SIGNATURE:
        header = _png(raw, exif == "apply")
    else:
        # Never the bytes themselves: a reason goes into errors and Loader.skipped, and the file may be anything.
        raise BadImage("not a JPEG or PNG image (its first bytes are neither signature)")
    if header.height == 0 or header.width == 0:
        raise BadImage(f"{header.format} header claims a {header.height}x{header.width} image")
    if header.height * header.width > max_pixels:
        raise BadImage(
            f"{header.format} header claims {header.height}x{header.width} = {header.height * header.width} pixels, "
            f"more than max_pixels={max_pixels} (a decompression bomb?)"
        )
    if header.orientation in (5, 6, 7, 8):  # a quarter turn (with or without a mirror): displayed sideways
        header = ImageHeader(header.format, header.width, header.height, header.channels, header.orientation)
    return header
