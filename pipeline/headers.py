"""Image header checks made on the host, before bytes enter the DALI graph.

DALI cannot skip a sample that fails inside a running pipeline (NVIDIA/DALI#3913), so the reader stage looks at
every image first: its format, its size (the random crop window needs it, and a decompression bomb is refused
here), its channel count, and whether it is complete. Only JPEG and PNG headers are parsed; both are read
without decoding, in a few microseconds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from stallfree.ingest.validate import DEFAULT_MAX_PIXELS

__all__ = ["DEFAULT_MAX_PIXELS", "BadImage", "ImageHeader", "read_header"]

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
    """What the header says: ``format`` ("jpeg" or "png"), ``height``, ``width``, ``channels``."""

    format: str
    height: int
    width: int
    channels: int


def _jpeg(data: bytes) -> ImageHeader:
    pos, n = 2, len(data)
    header: ImageHeader | None = None
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
            header = ImageHeader("jpeg", height, width, data[pos + 9])
        elif marker == 0xDA:  # start of scan: the entropy-coded data follows; it must end with EOI
            if header is None:
                raise BadImage("corrupt JPEG: scan data before any frame header")
            if data.rfind(b"\xff\xd9", pos) < 0:
                raise BadImage("truncated JPEG (no end-of-image marker after the scan data)")
            return header
        pos += 2 + length
    raise BadImage("truncated JPEG (the file ends before the image data)")


def _png(data: bytes) -> ImageHeader:
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise BadImage("truncated PNG (no IHDR chunk)")
    width, height, _depth, colour = struct.unpack_from(">IIBB", data, 16)
    if data[-12:-8] != b"\x00\x00\x00\x00" or data[-8:-4] != b"IEND":
        raise BadImage("truncated PNG (no IEND chunk at the end)")
    channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(colour)
    if channels is None:
        raise BadImage(f"corrupt PNG: colour type {colour}")
    return ImageHeader("png", height, width, channels)


def read_header(data: bytes | memoryview | np.ndarray, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageHeader:
    """Parse and check an encoded image's header.

    Raises:
        BadImage: for empty data, a format other than JPEG or PNG, a truncated or corrupt header, a zero size, or
            more than ``max_pixels`` pixels.
    """
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    if not raw:
        raise BadImage("empty file")
    if raw[:3] == b"\xff\xd8\xff":
        header = _jpeg(raw)
    elif raw[:8] == _PNG_SIGNATURE:
        header = _png(raw)
    else:
        raise BadImage(f"not a JPEG or PNG image (starts with {raw[:8]!r})")
    if header.height == 0 or header.width == 0:
        raise BadImage(f"{header.format} header claims a {header.height}x{header.width} image")
    if header.height * header.width > max_pixels:
        raise BadImage(
            f"{header.format} header claims {header.height}x{header.width} = {header.height * header.width} pixels, "
            f"more than max_pixels={max_pixels} (a decompression bomb?)"
        )
    return header
