"""Each format's header, parsed without decoding and checked for completeness: what the one image check reads.

:func:`parse_header` tells the format by content, never by a file's extension, and hands the bytes to its parser:
JPEG, PNG, WebP, BMP, TIFF, JPEG 2000 (a ``.jp2`` file or a bare codestream) and PNM (PBM, PGM, PPM), the formats
DALI's image decoder takes. The decision built on it (a size, a pixel limit, the displayed size) is
:func:`stallfree.ingest.images.read_header`'s; import the names from there. TIFF, whose structure EXIF blocks share,
is parsed by :mod:`.tiff`; what a parser returns and raises is :mod:`.image_header`'s.

A JPEG is complete when an end-of-image marker follows its last start-of-scan (entropy-coded data stuffs every
0xFF, so neither marker occurs inside it; an EXIF thumbnail's markers sit inside an APP1 segment, which is skipped
by its length). A PNG is complete when its IEND chunk is at the end, or followed by at most 64 bytes of trailing
data (which PIL and DALI's decoders ignore); its chunks before the image data must pass their CRC, as PIL's
``Image.open`` demands. The other formats are complete when the data their header points to is all there (a
WebP's RIFF size, a BMP's rows, a TIFF's strips or tiles, a JPEG 2000 codestream's end marker, a PNM's samples).
Every read of a header is bounded and every value checked before use, so a hostile header (cut short, a count of
0, an offset past the size) is a :class:`BadImage` like any other, never a ``struct.error`` or ``IndexError`` that
names no file.

EXIF orientation, read only when asked (``exif=True``): a JPEG's first ``Exif`` APP1 segment, a PNG's ``eXIf``
chunk and a WebP's ``EXIF`` chunk. A TIFF's own orientation tag is read always, because PIL's TIFF plugin turns the
image on ``Image.open``. BMP, JPEG 2000 and PNM carry no orientation.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterator

from stallfree.ingest.image_header import FORMAT_NAMES, BadImage, ImageHeader, read_field
from stallfree.ingest.tiff import parse_tiff, tiff_orientation

__all__ = ["PNG_TRAILING_LIMIT", "parse_header"]

#: Trailing bytes a PNG may carry after its IEND chunk.
PNG_TRAILING_LIMIT = 64

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers: C0-CF except DHT (C4), JPG (C8) and DAC (CC).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


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
            orientation = tiff_orientation(data[pos + 10 : pos + 2 + length])
        elif marker == 0xDA:  # start of scan: the entropy-coded data follows; it must end with EOI
            if frame is None:
                raise BadImage("corrupt JPEG: scan data before any frame header")
            # The last end-of-image marker must follow the last scan. Looked for from the end: a scan after the
            # last EOI is searched from that EOI on, not by a backward search for the last scan, which crossed the
            # whole entropy-coded data (35 of the check's 52 us on a 72 KiB photo).
            end = data.rfind(b"\xff\xd9")
            if end < 0 or data.find(b"\xff\xda", end) >= 0:
                raise BadImage("truncated JPEG (no end-of-image marker after the scan data)")
            return ImageHeader("jpeg", *frame, orientation or 1)
        pos += 2 + length
    raise BadImage("truncated JPEG (the file ends before the image data)")


def _png_chunks(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Each chunk's ``(offset, length, type)`` after the signature, up to ``IEND`` or the last whole chunk header."""
    pos, n = 8, len(data)
    while pos + 8 <= n:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"IEND":
            return
        yield pos, length, kind
        pos += 12 + length


def _png_orientation(data: bytes) -> int:
    """The orientation in a PNG's eXIf chunk (before or after the image data: PIL and DALI read both)."""
    for pos, length, kind in _png_chunks(data):
        if kind == b"eXIf":
            tiff = data[pos + 8 : pos + 8 + length]
            return tiff_orientation(tiff[6:] if tiff.startswith(b"Exif\x00\x00") else tiff)
    return 1


def _png(data: bytes, exif: bool) -> ImageHeader:
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise BadImage("truncated PNG (no IHDR chunk)")
    width, height, depth, colour = struct.unpack_from(">IIBB", data, 16)
    # IEND: zero length, the type, a 4-byte CRC; then at most PNG_TRAILING_LIMIT bytes of anything
    if data.rfind(b"\x00\x00\x00\x00IEND", max(0, len(data) - 12 - PNG_TRAILING_LIMIT)) < 0:
        raise BadImage(f"truncated PNG (no IEND chunk at the end, or more than {PNG_TRAILING_LIMIT} bytes after it)")
    channels = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}.get(colour)
    if channels is None:
        raise BadImage(f"corrupt PNG: colour type {colour}")
    _png_chunks_before_pixels(data)
    return ImageHeader("png", height, width, channels, _png_orientation(data) if exif else 1, depth=depth)


def _png_chunks_before_pixels(data: bytes) -> None:
    """Refuse a PNG whose chunks before its first IDAT run past its end or fail their CRC.

    PIL's ``Image.open`` checks those CRCs and refuses the file (so torchvision's ImageFolder, and ingest, which
    opens every image with PIL, fail on it), while DALI's libpng only warns about an ancillary chunk's and decodes:
    the check refuses it, so that the Loader and ingest agree and the Loader gives no pixels PIL would not.
    """
    for pos, length, kind in _png_chunks(data):
        if kind == b"IDAT":
            return
        name = kind.decode("latin-1")
        if pos + 12 + length > len(data):
            raise BadImage(f"truncated PNG (its {name!r} chunk runs past the end of the file)")
        if zlib.crc32(data[pos + 4 : pos + 8 + length]) != struct.unpack_from(">I", data, pos + 8 + length)[0]:
            raise BadImage(f"corrupt PNG: its {name!r} chunk fails its CRC (PIL refuses to open the file)")


# --- The formats DALI's decoder (fn.decoders.image) takes besides JPEG and PNG ------------------------------------
# Each parser returns the header and refuses a file that ends before its image data does (DALI would fail on it
# inside the graph). What is refused beyond that is what DALI 2.4's decoder was seen to fail on, or to decode
# otherwise than PIL: each message says so and how to get the image in.


def _webp_orientation(data: bytes) -> int:
    """The orientation in an extended WebP's ``EXIF`` chunk (chunks are padded to an even size), 1 without one."""
    pos = 12
    while pos + 8 <= len(data):
        kind, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if kind == b"EXIF":
            tiff = data[pos + 8 : pos + 8 + size]
            return tiff_orientation(tiff[6:] if tiff.startswith(b"Exif\x00\x00") else tiff)
        pos += 8 + size + (size & 1)
    return 1


def _webp(data: bytes, exif: bool) -> ImageHeader:
    (riff_size,) = struct.unpack_from("<I", data, 4)
    if len(data) < 8 + riff_size or len(data) < 30:
        raise BadImage(f"truncated WebP (its RIFF header says {8 + riff_size} bytes, the file has {len(data)})")
    chunk = data[12:16]
    if chunk == b"VP8 ":  # lossy: a 3-byte frame tag, the start code 9d 01 2a, then 14-bit width and height
        if data[23:26] != b"\x9d\x01\x2a":
            raise BadImage("corrupt WebP: no VP8 start code")
        width, height = (v & 0x3FFF for v in struct.unpack_from("<HH", data, 26))
        return ImageHeader("webp", height, width, 3)
    if chunk == b"VP8L":  # lossless: the signature 0x2f, then 14 bits width - 1, 14 bits height - 1, 1 bit alpha
        (bits,) = struct.unpack_from("<I", data, 21)
        return ImageHeader("webp", ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1, 4 if bits >> 28 & 1 else 3)
    if chunk == b"VP8X":  # extended: flags, then 24-bit canvas width - 1 and height - 1
        if data[20] & 0x02:
            raise BadImage("animated WebP: DALI's decoder takes still images only; save one frame")
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        orientation = _webp_orientation(data) if exif and data[20] & 0x08 else 1  # flag 0x08: an EXIF chunk
        return ImageHeader("webp", height, width, 4 if data[20] & 0x10 else 3, orientation)
    raise BadImage(f"corrupt WebP: unknown first chunk {chunk!r}")


def _bmp(data: bytes) -> ImageHeader:
    if len(data) < 26:
        raise BadImage("truncated BMP (no bitmap header)")
    offset, dib = struct.unpack_from("<II", data, 10)
    if dib == 12:  # OS/2 BITMAPCOREHEADER
        width, height, _planes, bits = struct.unpack_from("<HHHH", data, 18)
        compression, image_size = 0, 0
    elif dib >= 40 and len(data) >= 54:
        width, height, _planes, bits, compression, image_size = struct.unpack_from("<iiHHII", data, 18)
    else:
        raise BadImage(f"corrupt BMP: bitmap header of {dib} bytes")
    if compression in (0, 3, 6):  # uncompressed (BI_RGB, BI_BITFIELDS, BI_ALPHABITFIELDS): rows padded to 4 bytes
        needed = offset + (abs(width) * bits + 31) // 32 * 4 * abs(height)
    elif compression in (1, 2):  # RLE8, RLE4: the header's image size
        needed = offset + image_size
    else:
        raise BadImage(f"BMP with compression {compression} (JPEG or PNG inside a BMP): DALI's decoder does not take "
                       "it; save the image as JPEG or PNG")
    if len(data) < needed:
        raise BadImage(f"truncated BMP (its header needs {needed} bytes, the file has {len(data)})")
    return ImageHeader("bmp", abs(height), abs(width), 4 if bits == 32 else 3)


_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"


def _j2k(data: bytes, boxed: bool) -> ImageHeader:
    """A JPEG 2000 codestream (``data`` starts at its SOC marker): the SIZ segment, and the EOC marker at its end."""
    if len(data) < 45 or data[2:4] != b"\xff\x51":
        raise BadImage("corrupt JPEG 2000: no SIZ segment after the start of the codestream")
    x, y, x0, y0 = struct.unpack_from(">IIII", data, 8)
    (components,) = struct.unpack_from(">H", data, 40)
    if x0 >= x or y0 >= y:  # the image spans Xsiz - XOsiz by Ysiz - YOsiz
        raise BadImage(f"corrupt JPEG 2000: image offset ({x0}, {y0}) not inside its size ({x}, {y})")
    if components == 0:
        raise BadImage("corrupt JPEG 2000: no components")
    depth = max((data[42 + 3 * c] & 0x7F) + 1 for c in range(components)) if len(data) >= 42 + 3 * components else 0
    if not data.endswith(b"\xff\xd9"):
        raise BadImage("truncated JPEG 2000 (no end-of-codestream marker at its end)")
    if components == 1 and not boxed:
        raise BadImage("grayscale JPEG 2000 codestream (.j2k): DALI's decoder cannot make RGB of it; save it as a "
                       ".jp2 file (PIL: no_jp2=False) or as PNG")
    return ImageHeader("jpeg2000", y - y0, x - x0, components, depth=depth)


def _jp2(data: bytes) -> ImageHeader:
    """A JP2 file: boxes (length, type; length 1: a 64-bit length follows; 0: to the end); ``jp2c`` holds the image."""
    pos = 0
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        start = pos + 8
        if length == 1:
            (length,) = read_field(">Q", data, pos + 8, "JPEG 2000")
            start += 8
        end = len(data) if length == 0 else pos + length
        if end > len(data) or end < start:
            raise BadImage(f"truncated JPEG 2000 (the {kind.decode('latin-1')!r} box runs past the end of the file)")
        if kind == b"jp2c":
            return _j2k(data[start:end], boxed=True)
        pos = end
    raise BadImage("truncated JPEG 2000 (no codestream box)")


def _pnm(data: bytes) -> ImageHeader:
    """A PBM, PGM or PPM (P1-P6): whitespace-separated fields with ``#`` comments, then the samples."""
    kind = data[1] - ord("0")
    fields: list[int] = []
    pos, wanted = 2, 2 if kind in (1, 4) else 3
    while len(fields) < wanted:
        while pos < len(data) and (data[pos : pos + 1].isspace() or data[pos] == ord("#")):
            if data[pos] == ord("#"):
                pos = data.find(b"\n", pos) if b"\n" in data[pos:] else len(data)
            pos += 1
        token = re.match(rb"\d+", data[pos:pos + 20])
        if token is None:
            raise BadImage(f"truncated or corrupt PNM (P{kind}: a header field is missing)")
        fields.append(int(token.group()))
        pos += len(token.group())
    width, height = fields[0], fields[1]
    maxval = fields[2] if wanted == 3 else 1
    if not 0 < maxval < 65536:
        raise BadImage(f"corrupt PNM: maximum value {maxval}")
    channels = 3 if kind in (3, 6) else 1
    body = data[pos + 1 :]
    if kind == 1:
        found, needed = body.count(b"0") + body.count(b"1"), width * height
    elif kind in (2, 3):
        found, needed = len(body.split()), width * height * channels
    else:
        found = len(body)
        needed = (width + 7) // 8 * height if kind == 4 else width * height * channels * (1 if maxval < 256 else 2)
    if found < needed:
        raise BadImage(f"truncated PNM (P{kind} {width}x{height} needs {needed} samples' worth, the file has {found})")
    return ImageHeader("pnm", height, width, channels, depth=8 if maxval < 256 else 16)


def parse_header(raw: bytes, exif: bool) -> ImageHeader:
    """The header of ``raw`` (not empty), its format told by its first bytes; its EXIF orientation when ``exif``.

    The size is the stored one: turning it for the orientation is the caller's decision.

    Raises:
        BadImage: a format not in :data:`~.image_header.FORMATS`, a truncated or corrupt header, or a truncated file.
    """
    if raw[:3] == b"\xff\xd8\xff":
        return _jpeg(raw, exif)
    if raw[:8] == _PNG_SIGNATURE:
        return _png(raw, exif)
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return _webp(raw, exif)
    if raw[:2] == b"BM":
        return _bmp(raw)
    if raw[:4] in (b"II*\x00", b"MM\x00*"):
        return parse_tiff(raw)
    if raw[:12] == _JP2_SIGNATURE:
        return _jp2(raw)
    if raw[:2] == b"\xff\x4f":
        return _j2k(raw, boxed=False)
    if len(raw) > 2 and raw[:1] == b"P" and raw[1:2] in b"123456" and raw[2:3].isspace():
        return _pnm(raw)
    # Never the bytes themselves: a reason goes into errors and Loader.skipped, and the file may be anything.
    why = f"not an image the Loader decodes: its first bytes match none of {', '.join(FORMAT_NAMES)}"
    if raw[:6] in (b"GIF87a", b"GIF89a"):  # the one such format users meet often: name it, with the fix
        why += "; they are a GIF's, which DALI's decoder does not take: save it as PNG (one frame of an animation)"
    raise BadImage(why)
