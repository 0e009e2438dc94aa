"""What ingest checks and changes in each image: its header, its completeness, and optional re-encoding.

Whether a file is an image at all, and whether its header is acceptable, is decided by the Loader's own check
(:func:`stallfree.ingest.images.read_header`), by content and for every format, before anything else: so a file
ingest takes is one the Loader would take from a folder or a file list, and a file the Loader refuses there
(a GIF, an animated WebP, a TIFF DALI cannot decode) ingest refuses with the same reason, whatever the options, even
those that would re-encode it (``max_side``, ``raw``). The size the header claims is compared with ``max_pixels``
there, *before* anything is decoded, so a 100000x100000 header never allocates its pixels. PIL then opens the image
lazily (it decodes nothing) for what ingest does with it: ``validate=True`` decodes every image fully, and a format
shards do not keep is re-encoded. Nothing here unpickles.
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image

from stallfree.ingest.images import DEFAULT_MAX_PIXELS, BadImage, read_header

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


def check_image(data: bytes, *, max_pixels: int = DEFAULT_MAX_PIXELS, validate: bool = False) -> Checked:
    """Check ``data`` by the one image check, open it with PIL, and with ``validate`` decode it fully.

    Raises:
        Rejected: whatever :func:`~stallfree.ingest.images.read_header` refuses (empty data, a format the Loader
            does not decode, a truncated or corrupt file, a zero size, more than ``max_pixels`` pixels), with its
            reason; an image PIL cannot open; or (with ``validate``) a decode error.
    """
    try:
        read_header(data, max_pixels)
    except BadImage as err:
        raise Rejected(err.reason) from err
    with warnings.catch_warnings():
        # max_pixels was applied above; PIL's own warning (at half its error threshold, below the default
        # max_pixels) would refuse an image the Loader takes.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as err:
            raise Rejected(f"decompression bomb: {err}") from err
        except Exception as err:  # noqa: BLE001 - PIL raises many types for bad input; each is one rejection
            raise Rejected(f"not an image PIL can read ({_why(err)})") from err
        width, height = image.size
        if validate:
            try:
                image.load()
            except Exception as err:  # noqa: BLE001 - as above
                raise Rejected(f"decoding failed ({_why(err)})") from err
    return Checked(image.format or "unknown", height, width)


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
