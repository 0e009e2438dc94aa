"""What ingest checks and changes in each image: its header, its completeness, and optional re-encoding.

The header is read with PIL (``Image.open`` is lazy: it parses the header and decodes nothing). JPEG and PNG, which
shards keep as they are, must also pass the Loader's own check (:mod:`stallfree.ingest.images`, the one rule for
a complete image), so that every image ingest accepts is one the Loader reads back; a TIFF must be compressed as
that check takes (:data:`~stallfree.ingest.images.TIFF_COMPRESSIONS`), so that ingest and a Loader reading the
same file from a folder agree, whatever codecs this PIL was built with. The size the
header claims is compared with ``max_pixels`` *before* anything is decoded, so a 100000x100000 header never
allocates its pixels. ``validate=True`` decodes every image fully. Nothing here unpickles.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, TiffImagePlugin

from stallfree.ingest.images import DEFAULT_MAX_PIXELS, BadImage, read_header, tiff_compression

__all__ = ["DEFAULT_MAX_PIXELS", "Checked", "Rejected", "check_image", "convert"]

# Formats shards keep as they are; others (which the Loader reads from a folder too) are re-encoded losslessly.
_KEPT_FORMATS = ("JPEG", "PNG")


class Rejected(BadImage):
    """An image that does not go into a shard; ``reason`` goes to ``rejected.jsonl``."""


@dataclass(frozen=True)
class Checked:
    """An image that passed: its ``format`` as PIL names it, ``height`` and ``width``."""

    format: str
    height: int
    width: int


def _why(err: Exception) -> str:
    """The error's type and message, without object addresses (rejected.jsonl must not vary between runs)."""
    return f"{type(err).__name__}: " + re.sub(r"<[^<>]* at 0x[0-9a-fA-F]+>", "the data", str(err))


def _complete(data: bytes, image: Image.Image) -> None:
    """JPEG and PNG go into shards as they are: the Loader's own check (``images.read_header``) must pass them.

    A TIFF is re-encoded, but its compression must be one the Loader's check takes, so that the file is refused by
    ingest and by a Loader on its folder alike.
    """
    try:
        if image.format in _KEPT_FORMATS:
            read_header(data)
        elif isinstance(image, TiffImagePlugin.TiffImageFile):
            tiff_compression(int(image.tag_v2.get(TiffImagePlugin.COMPRESSION, 1)))
    except BadImage as err:
        raise Rejected(err.reason) from err


def check_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, validate: bool = False) -> Checked:
    """Read ``data``'s header (and with ``validate`` decode it fully).

    Raises:
        Rejected: empty data, not an image PIL knows, a truncated file, a zero size, more than ``max_pixels``
            pixels, or (with ``validate``) a decode error.
    """
    if not data:
        raise Rejected("empty file")
    # PIL's own bomb check is replaced by the explicit one below, which runs before any decoding and names the size.
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            raise Rejected(f"decompression bomb: {err}") from err
        except Exception as err:  # noqa: BLE001 - PIL raises many types for bad input; each is one rejection
            raise Rejected(f"not an image PIL can read ({_why(err)})") from err
        width, height = image.size
        fmt = image.format or "unknown"
        if width <= 0 or height <= 0:
            raise Rejected(f"{fmt} header claims a {height}x{width} image")
        if width * height > max_pixels:
            raise Rejected(
                f"{fmt} header claims {height}x{width} = {height * width} pixels, more than max_pixels={max_pixels}"
            )
        _complete(data, image)
        if validate:
            try:
                image.load()
            except Exception as err:  # noqa: BLE001 - as above
                raise Rejected(f"decoding failed ({_why(err)})") from err
    return Checked(fmt, height, width)


def _rgb(image: Image.Image) -> Image.Image:
    return image if image.mode == "RGB" else image.convert("RGB")


_ORIENTATION = 0x0112


def _orientation_exif(image: Image.Image) -> bytes:
    """An EXIF block holding only ``image``'s orientation tag (empty when it has none), for a re-encoded copy.

    A re-encoded image keeps its stored (unturned) pixels and its tag, so that the Loader's ``exif="ignore"`` and
    ``exif="apply"`` give the shard what they give the original file.
    """
    orientation = image.getexif().get(_ORIENTATION)
    if orientation in (None, 1):
        return b""
    exif = Image.Exif()
    exif[_ORIENTATION] = orientation
    return exif.tobytes()


def convert(
    data: bytes,
    checked: Checked,
    *,
    max_side: int | None = None,
    quality: int = 90,
    raw: tuple[int, int] | None = None,
) -> tuple[bytes, int, int]:
    """The bytes a shard stores for one image, and their height and width.

    Args:
        data: the encoded image, already accepted by :func:`check_image`.
        checked: what :func:`check_image` said of it.
        max_side: re-encode as JPEG (``quality``) when the longer side exceeds this, resized to it.
        quality: JPEG quality for re-encoded images.
        raw: ``(height, width)``: store decoded RGB uint8 pixels resized to exactly this (HWC, C-order); as PIL's
            ``convert("RGB")`` decodes them, not turned by their EXIF orientation (which raw pixels cannot carry).

    A re-encoded image (``max_side``, or a format other than JPEG and PNG) keeps its EXIF orientation tag.

    Raises:
        Rejected: the image fails to decode.
    """
    needs_decode = raw is not None or checked.format not in _KEPT_FORMATS
    needs_decode |= max_side is not None and max(checked.height, checked.width) > max_side
    if not needs_decode:
        return data, checked.height, checked.width
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # max_pixels was checked already
            image = Image.open(io.BytesIO(data))
            image.load()
    except Exception as err:  # noqa: BLE001 - PIL raises many types for bad input
        raise Rejected(f"decoding failed ({_why(err)})") from err
    if raw is not None:
        pixels = np.asarray(_rgb(image).resize((raw[1], raw[0]), Image.Resampling.BILINEAR, reducing_gap=None))
        return np.ascontiguousarray(pixels, np.uint8).tobytes(), raw[0], raw[1]
    out = io.BytesIO()
    if max_side is not None and max(checked.height, checked.width) > max_side:
        scale = max_side / max(checked.height, checked.width)
        size = (max(1, round(checked.width * scale)), max(1, round(checked.height * scale)))
        resized = _rgb(image).resize(size, Image.Resampling.BICUBIC)
        resized.save(out, "JPEG", quality=quality, exif=_orientation_exif(image))
        return out.getvalue(), size[1], size[0]
    # A format shards do not keep (BMP, WebP, TIFF, ...): lossless PNG with the same pixels.
    rgb = image if image.mode in ("RGB", "RGBA", "L") else image.convert("RGB")
    rgb.save(out, "PNG", exif=_orientation_exif(image))
    return out.getvalue(), checked.height, checked.width
