"""Rows of several fields, for the image-text ingest: JSON Lines and Parquet files, or a ``datasets.Dataset``.

The token ingest reads one field of a row (:mod:`.text_sources`); an image-text row needs several (its images, its
text or conversation), so rows come here as dicts of the fields asked for (a field the row lacks is absent from its
dict). The files are listed as :func:`~stallfree.ingest.text_sources.list_text_files` lists them (a file, or a
folder's files in name order) and rows are numbered as there (from 0 in each file; a JSON Lines file's blank lines
are no rows). A ``.json`` file that is one JSON array (LLaVA's ``llava_v1_5_mix665k.json``, as LLaVA's scripts read
it) is parsed whole, its elements the rows. A CSV file holds no images nor conversations, and is refused.

A Hugging Face ``datasets.Dataset`` is one "file" named ``dataset`` (its rows numbered in the dataset's order,
after any ``select`` or ``shuffle``), read as Arrow (``with_format("arrow")``), so an ``Image()`` column comes as its
stored ``{"bytes", "path"}``, never decoded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallfree.ingest.text_sources import BATCH, Bad, TextFile, count_rows, list_text_files, parquet_batches

__all__ = ["DATASET", "RecordFile", "columns", "is_dataset", "list_record_files", "read_records"]

#: How rows of a ``datasets.Dataset`` are named (``dataset:ROW``).
DATASET = "dataset"

#: ``(row, the fields asked for, or why the row is none)``.
Record = tuple[int, dict[str, Any] | Bad]


@dataclass(frozen=True)
class RecordFile:
    """One file of rows (or a dataset): ``name`` names its rows in messages and shards; ``rows`` counts them.

    ``array``: a ``.json`` file holding one JSON array of rows (row R is its element R), not JSON Lines.
    """

    name: str
    rows: int
    size: int
    text: TextFile | None = None
    dataset: Any = None
    array: bool = False


def is_dataset(source: Any) -> bool:
    """Whether ``source`` is a Hugging Face ``datasets.Dataset`` (told by its type's module: no import)."""
    return type(source).__module__.startswith("datasets.") and type(source).__name__ == "Dataset"


def list_record_files(source: Any) -> list[RecordFile]:
    """The files of ``source`` (a path, or a ``datasets.Dataset``) with their rows counted.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: a CSV file, or what :func:`~stallfree.ingest.text_sources.list_text_files` refuses.
        TypeError: ``source`` is neither a path nor a ``datasets.Dataset`` (a ``DatasetDict``: pick a split).
    """
    if is_dataset(source):
        return [RecordFile(DATASET, len(source), int(source.data.nbytes), dataset=source)]
    if not isinstance(source, (str, os.PathLike)):
        hint = " (a DatasetDict: pass one split, ds['train'])" if type(source).__name__.endswith("DatasetDict") else ""
        raise TypeError(f"an image-text source is a .jsonl/.parquet path, a folder of them or a datasets.Dataset, "
                        f"got {type(source).__name__}{hint}")
    files = list_text_files(source)
    for file in files:
        if file.format == "csv":
            raise ValueError(f"{file.path}: a CSV file holds no images nor conversations; write the rows as JSON "
                             "Lines or Parquet")
    return [RecordFile(f.name, len(_json_array(f.path)) if _is_array(f) else count_rows(f, ""), f.size, text=f,
                       array=_is_array(f)) for f in files]


def _is_array(file: TextFile) -> bool:
    """Whether a ``.json`` file is one JSON array (LLaVA's ``llava_v1_5_mix665k.json``), not JSON Lines."""
    if file.format != "jsonl" or file.path.suffix.lower() != ".json":
        return False
    with open(file.path, "rb") as f:
        while chunk := f.read(4096):
            head = chunk.lstrip()
            if head:
                return head[:1] == b"["
    return False


def _json_array(path: Path) -> list[Any]:
    """A ``.json`` file's array, parsed whole (as LLaVA's scripts load it)."""
    with open(path, "rb") as f:
        try:
            value = json.load(f)
        except ValueError as err:
            raise ValueError(f"{path} starts as a JSON array but is not valid JSON ({err}); write one object a "
                             "line (JSON Lines), or fix the file") from None
    if not isinstance(value, list):  # pragma: no cover - it starts with "["
        raise ValueError(f"{path} is not a JSON array")
    return value


def read_records(file: RecordFile, fields: list[str], start: int = 0) -> Iterator[list[Record]]:
    """The file's rows from row ``start`` on, in batches of about :data:`BATCH`, each a dict of ``fields``.

    A JSON Lines row's dict holds all its fields (they cost nothing more to keep); a Parquet file's or a dataset's
    holds those of ``fields`` it has (its columns: the caller checks them once, by :func:`columns`).
    """
    if file.dataset is not None:
        table = file.dataset.with_format("arrow")
        names = [f for f in fields if f in file.dataset.column_names]
        for first in range(start, file.rows, BATCH):
            rows = table[first : min(first + BATCH, file.rows)].select(names).to_pylist()
            yield [(first + i, row) for i, row in enumerate(rows)]
        return
    text = file.text
    if text is None:  # pragma: no cover - a RecordFile is a dataset or a file
        raise TypeError(f"{file.name} is neither a file nor a dataset")
    if text.format == "parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(text.path)
        names = [f for f in fields if f in parquet.schema_arrow.names]
        for row, batch in parquet_batches(parquet, names, start):
            yield [(row + i, values) for i, values in enumerate(batch.to_pylist())]
        return
    if file.array:
        rows = _json_array(text.path)
        for first in range(start, len(rows), BATCH):
            yield [(first + i, row if isinstance(row, dict) else Bad(f"not a JSON object (a {type(row).__name__})"))
                   for i, row in enumerate(rows[first : first + BATCH])]
        return
    yield from _jsonl_records(text.path, start)


def columns(file: RecordFile) -> list[str] | None:
    """The columns every row of a Parquet file or a dataset has; None for JSON Lines (each row has its own)."""
    if file.dataset is not None:
        return list(file.dataset.column_names)
    if file.text is not None and file.text.format == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(file.text.path).names)
    return None


def _jsonl_records(path: Path, start: int) -> Iterator[list[Record]]:
    rows: list[Record] = []
    with open(path, "rb") as f:
        for row, line in enumerate(f):
            if row < start or not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:  # UnicodeDecodeError too
                rows.append((row, Bad(f"not valid JSON ({err})")))
            else:
                if isinstance(record, dict):
                    rows.append((row, record))  # whole: a message about a missing field lists the row's fields
                else:
                    rows.append((row, Bad(f"not a JSON object (a {type(record).__name__})")))
            if len(rows) >= BATCH:
                yield rows
                rows = []
    if rows:
        yield rows
