"""Labels: the one rule a label must pass, and every row's label as one file beside the manifest (``labels.npy``).

**The rule**, shared by ``stallfree ingest`` and the Loader's readers so that the two accept and refuse the same
labels: a label is a class number, a whole number in ``0 .. MAX_CLASSES - 1`` (4,194,303: more classes than any
classification set holds, and few enough that the list of class names ``"0" .. "N"`` a reader builds from the largest
label stays small), or a class name (a string column: the sorted distinct names number the classes, at most
``MAX_CLASSES`` of them). A WebDataset ``.cls`` holds ASCII digits (:func:`parse_label`: ``"²"`` and other Unicode
digits, signs, fractions and exponents are refused); a table's numbers may be floats only where they are whole
(:func:`label_array`). Every refusal names the tar member, row or item.

**The file.**

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
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.core.atomic import atomic_path
from stallfree.ingest.manifest import LABELS, file_sha256

__all__ = ["MAX_CLASSES", "check_labels", "class_numbers", "label_array", "label_column", "load_labels", "parse_label",
           "parse_labels", "save_labels", "shard_labels", "smallest_dtype", "write_labels"]

#: Labels are class numbers below this (or class names, at most this many): see the module's docstring.
MAX_CLASSES = 1 << 22

_DTYPES = (np.int8, np.int16, np.int32, np.int64)
_DIGITS = re.compile(rb"[0-9]+")  # ASCII only: str.isdigit() and int() also take "²" and "٣"


def _too_large(shown: object) -> str:
    return f"label {shown} is over {MAX_CLASSES - 1}, the largest class number stallfree takes"


def parse_label(text: bytes) -> int:
    """A WebDataset ``.cls`` member's label: ASCII digits, perhaps with ASCII white space around them.

    Raises:
        ValueError: anything else, or a number of ``MAX_CLASSES`` or more; the message is the reason alone, for the
            caller to name the member.
    """
    digits = text.strip()
    if not _DIGITS.fullmatch(digits):
        raise ValueError(f".cls is not a non-negative integer: {digits.decode('utf-8', 'replace')[:32]!r}")
    if len(digits) > len(str(MAX_CLASSES)) or int(digits) >= MAX_CLASSES:  # int() of a few digits only
        raise ValueError(_too_large(digits[:64].decode()))
    return int(digits)


def label_array(values: Any, where: str, unit: str = "row") -> np.ndarray:
    """``values`` (integers, or floats that are whole) as int64 labels, each in ``0 .. MAX_CLASSES - 1``.

    Raises:
        ValueError: naming ``where``, the first bad ``unit`` (``"row"``, ``"item"``) and its value.
    """
    values = np.asarray(values)
    if values.dtype.kind not in "iubf":
        raise ValueError(f"{where}: labels must be class names or whole numbers, got {values.dtype}")
    with np.errstate(invalid="ignore"):  # NaN compares False everywhere: refused as not whole
        fraction = ~(np.isfinite(values) & (np.floor(values) == values)) if values.dtype.kind == "f" else False
        bad = fraction | (values < 0) | (values >= MAX_CLASSES)
    if not np.any(bad):
        return values.astype(np.int64)
    i = int(np.argmax(bad))
    value = values[i].item()
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)  # 2.0 shown as 2; 1e+20 as it is
    if isinstance(value, float) and not value.is_integer():
        why = f"label {value} is not a whole number"
    else:
        why = f"negative label {value}" if value < 0 else _too_large(value)
    raise ValueError(f"{where} {unit} {i}: {why}")


def class_numbers(labels: np.ndarray) -> list[str]:
    """The class names of numbered labels (checked by :func:`label_array` or :func:`parse_label`): ``"0" .. max``."""
    top = int(labels.max(initial=-1))
    if top >= MAX_CLASSES:  # a check missed upstream would build a list of 10^12 strings here
        raise ValueError(_too_large(top))
    return [str(i) for i in range(top + 1)]


def label_column(column: Any, where: str) -> tuple[np.ndarray, list[str]]:
    """Every row's label (int64) and the class names, from an Arrow label column of class names or numbers.

    Ingest's file lists and Parquet and the Loader's :class:`~stallfree.pipeline.readers.FileListReader` read their
    labels here. In Arrow, not Python objects: every part of a split ingest reads the whole column.

    Raises:
        ValueError: an empty cell, a bad number (:func:`label_array`) or over ``MAX_CLASSES`` names, naming
            ``where`` and the row.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):  # a categorical column: its values, not its codes
        column = pc.cast(column, column.type.value_type)
    if column.null_count:
        raise ValueError(f"{where} row {pc.index(pc.is_null(column), True).as_py()}: empty label cell")
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        names = pc.unique(column)
        if len(names) > MAX_CLASSES:
            raise ValueError(f"{where} holds {len(names)} distinct class names, over {MAX_CLASSES}: is the label "
                             "column a per-row value?")
        classes = sorted(names.to_pylist())
        return pc.index_in(column, value_set=pa.array(classes, column.type)).to_numpy().astype(np.int64), classes
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type) or pa.types.is_boolean(column.type)):
        raise ValueError(f"{where}: labels must be class names or whole numbers, got {column.type}")
    labels = label_array(column.to_numpy(), where)
    return labels, class_numbers(labels)


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
