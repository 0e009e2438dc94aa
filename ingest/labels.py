"""Every row's label as one file beside the manifest: ``labels.npy``, so a reader need not open every shard.

The shards hold each row's label in their ``label`` column; a reader that wants the whole label array (the Loader,
at construction) would have to open every shard for it: 48,829 shards at 100M samples. So an ingest writes the
labels once more as a NumPy ``.npy`` file (``np.save``, no pickle), rows in manifest order, in the smallest signed
integer dtype that holds them (``int16`` for ImageNet's 1,000 classes: 2 bytes a row instead of 8), before the
manifest, which records its name, size, SHA-256 and dtype under ``"labels"``. ``stallfree verify`` compares it
with the shards' label columns. A manifest written by an older stallfree has no ``"labels"`` entry: its readers
read the label columns, as before.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.ingest.atomic import atomic_path
from stallfree.ingest.manifest import LABELS, file_sha256

__all__ = ["check_labels", "load_labels", "parse_labels", "save_labels", "shard_labels", "smallest_dtype",
           "write_labels"]

_DTYPES = (np.int8, np.int16, np.int32, np.int64)


def smallest_dtype(values: np.ndarray) -> np.dtype[Any]:
    """The smallest signed integer dtype holding every one of ``values`` (int8 for none)."""
    if len(values) == 0:
        return np.dtype(np.int8)
    low, high = int(values.min()), int(values.max())
    return next(np.dtype(t) for t in _DTYPES if np.iinfo(t).min <= low and high <= np.iinfo(t).max)


def shard_labels(path: str | os.PathLike[str]) -> np.ndarray:
    """The ``label`` column of the shard at ``path``, in the smallest dtype holding it."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(str(path)) as source:
        reader = ipc.open_file(source)
        pieces = [reader.get_batch(i).column("label").to_numpy(zero_copy_only=False)
                  for i in range(reader.num_record_batches)]
    values = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
    return values.astype(smallest_dtype(values))


def write_labels(out: Path, shard_files: Iterable[str], name: str = LABELS) -> dict[str, Any]:
    """Write ``out/labels.npy`` (or ``name``) from the label columns of ``shard_files`` (in ``out``, in order).

    Returns the manifest's ``"labels"`` entry: ``{"file", "bytes", "sha256", "dtype"}``.
    """
    # Each shard's labels in its own smallest dtype: concatenating promotes to the smallest that holds them all,
    # so the whole array is never held as int64 (800 MB at 100M rows).
    pieces = [shard_labels(out / name) for name in shard_files]
    return save_labels(out, np.concatenate(pieces) if pieces else np.empty(0, np.int8), name)


def save_labels(out: Path, labels: np.ndarray, name: str = LABELS) -> dict[str, Any]:
    """Write ``labels`` (in its dtype) as ``out/labels.npy`` (or ``name``), atomically; returns its manifest entry."""
    path = out / name
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, labels, allow_pickle=False)
    return {"file": name, "bytes": path.stat().st_size, "sha256": file_sha256(path), "dtype": str(labels.dtype)}


def check_labels(labels: np.ndarray, entry: dict[str, Any], rows: int, where: str) -> str | None:
    """How a loaded labels array differs from its manifest ``entry`` and ``rows``, or None (``where`` names it)."""
    if labels.ndim != 1 or len(labels) != rows:
        return f"{where} holds {labels.shape} labels, the manifest says {rows} rows"
    if labels.dtype.kind != "i" or str(labels.dtype) != entry["dtype"]:
        return f"{where} holds {labels.dtype} labels, the manifest says {entry['dtype']}"
    return None


def load_labels(folder: Path, entry: dict[str, Any], rows: int) -> np.ndarray:
    """``folder``'s labels file, memory-mapped (read-only), its size, dtype and length checked against the manifest.

    Raises:
        FileNotFoundError: the file is missing.
        OSError: it is of another size than the manifest's, or not a NumPy array of the manifest's dtype and length
            (the message names the file).
    """
    path = folder / entry["file"]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is listed in the manifest but missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise OSError(f"{path} has {size} bytes but the manifest says {entry['bytes']} (truncated?)")
    try:
        labels = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        raise OSError(f"{path} is not a NumPy array file ({err})") from err
    problem = check_labels(labels, entry, rows, str(path))
    if problem is not None:
        raise OSError(problem)
    return labels


def parse_labels(data: bytes, entry: dict[str, Any], rows: int, where: str) -> np.ndarray:
    """A labels file's bytes (fetched from ``where``, a URL for messages), checked against the manifest's ``entry``.

    Raises:
        OSError: of another size or SHA-256 than the manifest's, or not a NumPy array of its dtype and length.
    """
    if len(data) != entry["bytes"]:
        raise OSError(f"{where} has {len(data)} bytes but the manifest says {entry['bytes']} (truncated?)")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise OSError(f"{where}: SHA-256 differs from the manifest's (the object was altered)")
    try:
        labels = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as err:
        raise OSError(f"{where} is not a NumPy array file ({err})") from err
    problem = check_labels(labels, entry, rows, where)
    if problem is not None:
        raise OSError(problem)
    return labels
