"""TIFF: the format's header, and the orientation tag of any TIFF structure (EXIF's layout, inside JPEG, PNG and WebP).

A TIFF is complete when its strips or tiles are all there. Its own orientation tag is read always, because PIL's TIFF
plugin turns the image on ``Image.open``; :func:`tiff_orientation` reads the same tag from the EXIF block of the other
formats when asked. Every read is bounded and every value checked before use (a :class:`~.image_header.BadImage`,
never a ``struct.error``).
"""

from __future__ import annotations

import struct

from stallfree.ingest.image_header import EXIF_ORIENTATION, BadImage, ImageHeader, read_field

__all__ = ["TIFF_COMPRESSIONS", "parse_tiff", "tiff_compression", "tiff_orientation"]


def tiff_orientation(tiff: bytes) -> int:
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
        if tag == EXIF_ORIENTATION:
            if kind == 3:  # SHORT
                return int(struct.unpack_from(order + "H", tiff, entry + 8)[0])
            if kind == 4:  # LONG
                return int(struct.unpack_from(order + "I", tiff, entry + 8)[0])
            return 1
    return 1



_TIFF_SIZES = {1: 1, 3: 2, 4: 4, 16: 8}  # BYTE, SHORT, LONG, LONG8: the integer types a TIFF tag here may hold
# The tags the check reads: each must hold a value when present.
_TIFF_READ = frozenset({256, 257, 258, 259, 273, 277, 279, 324, 325, EXIF_ORIENTATION})
#: The TIFF compressions the check takes (the Compression tag, 259): none, CCITT (2-4), LZW, JPEG, Deflate (8, 32946)
#: and PackBits, which every build of PIL decodes (libtiff's own codecs, zlib and libjpeg) and DALI decodes to the
#: same pixels. ZSTD, LZMA and WebP are optional in libtiff, so a PIL without the codec cannot decode the strips;
#: DALI 2.4 fails on LZMA and delivers a ZSTD strip it cannot decode as a black image. The rest decode otherwise.
TIFF_COMPRESSIONS = frozenset({1, 2, 3, 4, 5, 7, 8, 32773, 32946})
_TIFF_OTHER_COMPRESSIONS = {6: "old-style JPEG", 34925: "LZMA", 50000: "ZSTD", 50001: "WebP"}


def tiff_compression(code: int) -> None:
    """Refuse a TIFF Compression tag value not in :data:`TIFF_COMPRESSIONS`.

    Raises:
        BadImage: naming the compression and how to get the image in.
    """
    if code not in TIFF_COMPRESSIONS:
        name = _TIFF_OTHER_COMPRESSIONS.get(code, "an unknown compression")
        raise BadImage(f"TIFF compressed with {name} ({code}): not every PIL decodes it and DALI's decoder does not "
                       "decode it as PIL does; save it with compression='tiff_lzw', or as PNG")


def parse_tiff(data: bytes) -> ImageHeader:
    """The header of the TIFF ``data`` (little- or big-endian), its strips or tiles checked to be there."""
    order = "<" if data[:2] == b"II" else ">"
    (ifd,) = read_field(order + "I", data, 4, "TIFF")
    if ifd + 2 > len(data):
        raise BadImage("truncated TIFF (its first directory lies past the end of the file)")
    (count,) = struct.unpack_from(order + "H", data, ifd)
    if ifd + 2 + 12 * count > len(data):
        raise BadImage("truncated TIFF (its first directory runs past the end of the file)")
    tags: dict[int, list[int]] = {}
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind, n = struct.unpack_from(order + "HHI", data, entry)
        size = _TIFF_SIZES.get(kind)
        if size is None:
            continue
        if n == 0 and tag in _TIFF_READ:
            raise BadImage(f"corrupt TIFF: tag {tag} has no values")
        at = entry + 8 if n * size <= 4 else struct.unpack_from(order + "I", data, entry + 8)[0]
        if at + n * size > len(data):
            raise BadImage(f"truncated TIFF (tag {tag}'s values lie past the end of the file)")
        code = {1: "B", 2: "H", 4: "I", 8: "Q"}[size]
        tags[tag] = list(struct.unpack_from(f"{order}{n}{code}", data, at))
    if 256 not in tags or 257 not in tags:
        raise BadImage("corrupt TIFF: no ImageWidth or ImageLength tag")
    offsets, counts = tags.get(273, tags.get(324, [])), tags.get(279, tags.get(325, []))
    if not offsets or len(offsets) != len(counts):
        raise BadImage("corrupt TIFF: no strip or tile offsets with their byte counts")
    needed = max(o + c for o, c in zip(offsets, counts, strict=True))
    if len(data) < needed:
        raise BadImage(f"truncated TIFF (its strips or tiles need {needed} bytes, the file has {len(data)})")
    if 258 not in tags and tags.get(259, [1]) == [1]:
        raise BadImage("uncompressed TIFF without a BitsPerSample tag (as PIL saves 1-bit images): DALI's decoder "
                       "refuses it; save it with compression='tiff_lzw', or as PNG")
    tiff_compression(tags.get(259, [1])[0])
    depth = max(tags.get(258, [1]))
    orientation = tags.get(EXIF_ORIENTATION, [1])[0]  # applied whatever ``exif`` says (module docstring)
    return ImageHeader("tiff", tags[257][0], tags[256][0], tags.get(277, [1])[0], orientation, depth)
