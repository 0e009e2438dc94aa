"""What a header parser returns and raises: :class:`ImageHeader`, :class:`BadImage`, and the formats by name.

Shared by the parsers (:mod:`.image_formats`, and :mod:`.tiff` for the TIFF structure EXIF blocks use too), with
:func:`read_field`, which refuses a header cut short with the check's own error. The decision built on a header is
:func:`stallfree.ingest.images.read_header`'s (import the names from there).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["EXIF_ORIENTATION", "FORMATS", "FORMAT_NAMES", "BadImage", "ImageHeader", "read_field"]

#: The formats the one check takes (``ImageHeader.format``): those DALI's ``fn.decoders.image`` decodes.
FORMATS = ("jpeg", "png", "webp", "bmp", "tiff", "jpeg2000", "pnm")
#: How messages name them.
FORMAT_NAMES = ("JPEG", "PNG", "WebP", "BMP", "TIFF", "JPEG 2000", "PNM (PBM/PGM/PPM)")


class BadImage(ValueError):
    """An image the graph must not see; ``reason`` says what is wrong with it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ImageHeader:
    """What the header says: ``format`` (one of :data:`FORMATS`), ``height``, ``width``, ``channels``.

    ``orientation`` is the EXIF orientation (1 when absent, or when it was not read: ``exif="ignore"``);
    ``height`` and ``width`` are the displayed size when it was applied, else the stored size. ``depth`` is the
    bits per sample where the header of a format other than JPEG says more than 8 (PNG, TIFF, JPEG 2000, PNM).
    """

    format: str
    height: int
    width: int
    channels: int
    orientation: int = 1
    depth: int = 8


#: The EXIF (and TIFF) tag of the orientation.
EXIF_ORIENTATION = 0x0112


def read_field(fmt: str, data: bytes, at: int, what: str) -> tuple[Any, ...]:
    """``struct.unpack_from`` that refuses a header cut short with the check's own error, naming ``what``."""
    if at < 0 or at + struct.calcsize(fmt) > len(data):
        raise BadImage(f"truncated {what} (its header ends at byte {len(data)}, before the field at byte {at})")
    return struct.unpack_from(fmt, data, at)
