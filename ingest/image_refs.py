"""A sample's images as a row gives them: a path, bytes, or a Hugging Face ``Image`` value; read and checked once.

An image-text row (:mod:`.image_text_runner`) names its images in one field, one image or a list of them. Each is:

- a path (a string): a relative path is taken from the image root (``--image-root``; default the source file's
  folder) and must stay inside it (no ``..``, no link leading out: the image ingest's rule, ``folders.outside_root``);
  an absolute path is taken as it is (a ``datasets.Dataset`` built from files stores absolute paths);
- bytes (a Parquet ``binary`` cell, a ``datasets.Dataset`` cell);
- a Hugging Face ``Image()`` feature's value ``{"bytes": ..., "path": ...}`` (its bytes when present, else its path).

Every image passes the one image check (:func:`stallfree.ingest.images.read_header`, the image ingest's and the
Loader's), and its size (height, width) is the one that check reports. What fails is an :class:`ImageProblem` whose
message names the image by its position in the row and its path, for the caller to raise or skip as the row's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stallfree.ingest.folders import outside_root
from stallfree.ingest.images import DEFAULT_MAX_PIXELS, BadImage, read_header

__all__ = ["ImageProblem", "image_refs", "load_image"]


class ImageProblem(ValueError):
    """An image of a row that cannot go into a shard, and why (the message is the row's reason)."""


def image_refs(value: Any, field: str) -> list[Any]:
    """The images a row's ``field`` value names: one image, or a list of them (``None``: none).

    Raises:
        ImageProblem: a value that is neither (a number, a list holding a list).
    """
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if not _is_ref(item):
                raise ImageProblem(f"{field}[{i}] is no image (a path, bytes or {{'bytes', 'path'}}), got "
                                   f"{_shown(item)}")
        return list(value)
    if not _is_ref(value):
        raise ImageProblem(f"{field} is no image (a path, bytes or {{'bytes', 'path'}}, or a list of them), got "
                           f"{_shown(value)}")
    return [value]


def _is_ref(value: Any) -> bool:
    return isinstance(value, (str, bytes, bytearray, memoryview)) or (
        isinstance(value, dict) and ("bytes" in value or "path" in value))


def _shown(value: Any) -> str:
    text = f"{type(value).__name__} {value!r}"
    return text if len(text) <= 60 else text[:57] + "..."


def load_image(ref: Any, root: Path, which: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[bytes, tuple[int, int]]:
    """The encoded bytes of the image ``ref`` and its ``(height, width)``, checked (``which`` names it: "image 0").

    Raises:
        ImageProblem: a missing or unreadable file, empty bytes, or an image the one check refuses.
    """
    path: str | None = None
    data: bytes | None = None
    if isinstance(ref, dict):
        raw = ref.get("bytes")
        path = ref.get("path")
        if raw is not None:
            data = bytes(raw)
        elif not isinstance(path, str) or not path:
            raise ImageProblem(f"{which} has neither bytes nor a path")
    elif isinstance(ref, str):
        path = ref
    else:
        data = bytes(ref)
    named = f"{which} ({path})" if path else which
    if data is None:
        path = path or ""  # a str here: a dict without bytes has a path, a str ref is one
        if not path.strip():
            raise ImageProblem(f"{which}: an empty path")
        if "\0" in path:
            raise ImageProblem(f"{named}: the path holds a NUL byte")
        if not os.path.isabs(path):
            (problem,) = outside_root(root, [path])
            if problem is not None:
                raise ImageProblem(f"{named}: {problem}")
        file = Path(path) if os.path.isabs(path) else root / path
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            raise ImageProblem(f"{named}: no such file {file}") from None
        except OSError as err:
            raise ImageProblem(f"{named}: cannot read {file} ({err.strerror or err})") from None
    try:
        header = read_header(data, max_pixels)
    except BadImage as err:
        raise ImageProblem(f"{named}: {err.reason}") from None
    return data, (header.height, header.width)
