"""The one image check: what a complete, safe image is, for ingest and for the Loader alike.

The formats are those DALI's image decoder takes: JPEG, PNG, WebP, BMP, TIFF, JPEG 2000 (a ``.jp2`` file or a bare
codestream) and PNM (PBM, PGM, PPM), told by content, never by a file's extension; anything else (a GIF, an
animated WebP) is refused with the list, before it reaches the graph, and by ingest too, even where it could have
decoded the file with PIL and stored it re-encoded: :func:`read_header` is the one answer to "is this an image?".

DALI cannot skip a sample that fails inside a running pipeline (NVIDIA/DALI#3913), so the Loader's reader stage
looks at every image first, and ingest applies the same rule before an image goes into a shard (so that what
ingest accepts the Loader reads back): its format, its size (the random crop window needs it, and a
decompression bomb is refused here), its channel count, and whether it is complete. Each format's header is parsed
without decoding, in a few microseconds, and checked for completeness by :mod:`~stallfree.ingest.image_formats`
(which says what complete means per format); this module decides on what the header says.

EXIF orientation: by default (``exif="ignore"``) the size is the stored one, as PIL's ``Image.open`` reports it and
as the graph decodes it (DALI's ``adjust_orientation=False``). With ``exif="apply"`` the orientation tag is read
(a JPEG's first ``Exif`` APP1 segment, a PNG's ``eXIf`` chunk) and orientations 5-8, a quarter turn, swap height
and width: the displayed size, which ``ImageOps.exif_transpose`` gives and the graph decodes, so that crop windows
are drawn on it. Values outside 1-8 turn nothing, as in PIL and DALI. A WebP's ``EXIF`` chunk is read as well. A
TIFF's own orientation tag is applied under both modes, because PIL's TIFF plugin turns the image on ``Image.open``
(the graph hands such a TIFF to PIL under ``exif="ignore"``). BMP, JPEG 2000 and PNM carry no orientation.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np

from stallfree.ingest.image_formats import parse_header
from stallfree.ingest.image_header import FORMAT_NAMES, FORMATS, BadImage, ImageHeader
from stallfree.ingest.tiff import TIFF_COMPRESSIONS, tiff_compression

__all__ = [
    "DEFAULT_MAX_PIXELS", "EXIF_MODES", "FORMATS", "FORMAT_NAMES", "TIFF_COMPRESSIONS", "BadImage", "Exif",
    "ImageHeader", "read_header", "tiff_compression",
]

#: What a Loader does with an image's EXIF orientation (see the module docstring).
EXIF_MODES = ("ignore", "apply")
Exif = Literal["ignore", "apply"]

#: The default ``max_pixels`` (PIL's decompression-bomb error threshold), for ingest and the Loader.
DEFAULT_MAX_PIXELS = 178_956_970


def read_header(
    data: bytes | memoryview | np.ndarray, max_pixels: int = DEFAULT_MAX_PIXELS, *, exif: Exif = "ignore"
) -> ImageHeader:
    """Parse and check an encoded image's header; with ``exif="apply"`` report the displayed (EXIF-turned) size.

    Raises:
        BadImage: for empty data, a format not in :data:`FORMATS`, a truncated or corrupt header, a truncated
            file, a zero size, or more than ``max_pixels`` pixels.
    """
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    if not raw:
        raise BadImage("empty file")
    header = parse_header(raw, exif == "apply")
    if header.height <= 0 or header.width <= 0:
        raise BadImage(f"{header.format} header claims a {header.height}x{header.width} image")
    if header.channels <= 0:
        raise BadImage(f"{header.format} header claims {header.channels} channels")
    if header.height * header.width > max_pixels:
        raise BadImage(
            f"{header.format} header claims {header.height}x{header.width} = {header.height * header.width} pixels, "
            f"more than max_pixels={max_pixels} (a decompression bomb?)"
        )
    if header.orientation in (5, 6, 7, 8):  # a quarter turn (with or without a mirror): displayed sideways
        header = replace(header, height=header.width, width=header.height)
    return header
