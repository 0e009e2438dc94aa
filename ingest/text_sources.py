"""Sources of documents: JSON Lines, Parquet and CSV files (or a folder of them) of text or of token ids.

``stallfree ingest`` and the Loader's in-place token readers list and read them here. A source is one file, or a
folder's files with these endings (its own files, sorted by name; not its subfolders, nor hidden files; a ``.json``
only as a file of its own, since a folder's ``.json`` is as often its ``dataset_info.json``):

==============  =====================================================================================
``.jsonl``      JSON Lines (a ``.json`` file too, as ``datasets``' ``to_json`` writes them): one object a line
``.parquet``    a text column, or an integer-list column of token ids
``.csv``        a text column (a header row names the columns; quoted values may hold newlines)
==============  =====================================================================================

Rows are numbered from 0 in each file: a Parquet or CSV file's data rows, a JSON Lines file's lines (row ``R`` is
line ``R + 1``; a blank line is no row). A row's value is read as text or as token ids (a :data:`Mode`); a row that
is none (a missing field, not text, not a list of integers) comes as a :class:`Bad` with its reason, for the caller
to raise or skip. A file whose column is missing or of the wrong type is a ``ValueError`` naming the file and its
columns: a wrong flag, not a bad row.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from stallfree.ingest.folders import outside_root
from stallfree.ingest.token_check import ids_of, list_problems, text_problem

__all__ = ["BATCH", "FORMATS", "TOKEN_COLUMNS", "Bad", "Mode", "Row", "TextFile", "choose_field", "columns_of",
           "count_rows", "is_int_list", "is_token_source", "list_text_files", "parquet_batches", "read_rows"]

#: File endings a source's files are taken by, and their format.
FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}
#: The endings a folder's files are taken by (not ``.json``: see the module's docstring).
_IN_FOLDERS = (".jsonl", ".parquet", ".csv")
#: The columns taken as token ids when none is named, in this order (Hugging Face's name first).
TOKEN_COLUMNS = ("input_ids", "tokens")
#: Rows per batch read.
BATCH = 1024

#: What a row's value is read as: text to tokenize, or token ids.
Mode = Literal["text", "tokens"]


@dataclass(frozen=True)
class TextFile:
    """One file of a source: ``name`` is how messages and the shards' ``source`` column name it."""

    path: Path
    name: str
    format: str
    size: int


@dataclass(frozen=True)
class Bad:
    """A row that is no document, and why."""

    reason: str


#: ``(row, value)``: the value is text (``str``), token ids (a 1-D integer array) or :class:`Bad`.
Row = tuple[int, str | np.ndarray | Bad]


def list_text_files(source: str | os.PathLike[str]) -> list[TextFile]:
    """The files of ``source``: the file itself, or a folder's files with a known ending, sorted by name.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: a file of another ending, a folder holding none, or a link leading out of the folder.
    """
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"source {path} does not exist")
    if path.is_file():
        kind = FORMATS.get(path.suffix.lower())
        if kind is None:
            raise ValueError(f"source {path}: expected a {', '.join(FORMATS)} file, got {path.suffix!r}")
        return [TextFile(path, path.name, kind, path.stat().st_size)]
    names = sorted(entry.name for entry in os.scandir(path)
                   if not entry.name.startswith(".") and entry.is_file()
                   and Path(entry.name).suffix.lower() in _IN_FOLDERS)
    if not names:
        raise ValueError(f"no {', '.join(_IN_FOLDERS)} files in {path}")
    for name, problem in zip(names, outside_root(path, names), strict=True):
        if problem is not None:
            raise ValueError(f"{path / name} is refused: {problem}; every file must lie inside {path}")
    return [TextFile(path / name, name, FORMATS[Path(name).suffix.lower()], (path / name).stat().st_size)
            for name in names]


def columns_of(file: TextFile) -> list[str]:
    """The file's column names: a Parquet schema's, a CSV header's, a JSON Lines file's first object's keys."""
    if file.format == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(file.path).names)
    if file.format == "csv":
        with open(file.path, newline="", encoding="utf-8-sig") as f:
            return next(csv.reader(f), [])
    with open(file.path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    return []
                return list(first) if isinstance(first, dict) else []
    return []


def choose_field(files: list[TextFile], text_field: str | None, tokens_field: str | None,
                 tokenizer: bool) -> tuple[Mode, str]:
    """What to read, and from which field: the one named, else text with a tokenizer, else ``input_ids``/``tokens``.

    Raises:
        ValueError: both fields named; no tokenizer for text; no field named and none found in the first file (the
            message lists its columns and the flags that name one).
    """
    if text_field is not None and tokens_field is not None:
        raise ValueError("--text-field and --tokens-field exclude each other: a source holds text to tokenize, or "
                         "token ids")
    if tokens_field is not None:
        return "tokens", tokens_field
    if text_field is not None or tokenizer:
        if not tokenizer:
            raise ValueError(f"--text-field {text_field} needs --tokenizer PATH (a tokenizer.json, or a transformers "
                             "tokenizer folder) to tokenize the text")
        return "text", text_field or "text"
    first = files[0]
    columns = columns_of(first)
    found = next((name for name in TOKEN_COLUMNS if name in columns), None)
    if found is not None and first.format != "csv":
        return "tokens", found
    images = ("; rows with images and a caption or a conversation: add --layout caption or --layout conversations"
              if {"image", "images", "conversations"} & set(columns) else "")
    if "text" in columns:
        raise ValueError(f"{first.path} holds text (its field 'text'): pass --tokenizer PATH (a tokenizer.json, or a "
                         f"transformers tokenizer folder) to tokenize it{images}")
    raise ValueError(f"{first.path} has neither token ids ({' or '.join(TOKEN_COLUMNS)}) nor text; its fields are "
                     f"{columns}: name one with --tokens-field NAME, or --text-field NAME with --tokenizer "
                     f"PATH{images}")


def count_rows(file: TextFile, field: str) -> int:
    """How many rows the file holds (read from a Parquet file's metadata; a JSON Lines or CSV file is scanned)."""
    if file.format == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(file.path).metadata.num_rows)
    if file.format == "jsonl":
        with open(file.path, "rb") as f:
            return sum(1 for line in f if line.strip())
    return sum(batch.num_rows for batch in _csv_batches(file, field))


def read_rows(file: TextFile, field: str, mode: Mode, start: int = 0) -> Iterator[list[Row]]:
    """The file's rows from row ``start`` on, in batches of about :data:`BATCH`, each value read as ``mode`` says.

    Raises:
        ValueError: the file lacks ``field``, or holds it as another type than ``mode`` needs (named).
    """
    if file.format == "jsonl":
        yield from _jsonl_rows(file, field, mode, start)
    elif file.format == "parquet":
        yield from _parquet_rows(file, field, mode, start)
    else:
        if mode == "tokens":
            raise ValueError(f"{file.path}: a CSV file holds text; token ids need a Parquet or JSON Lines file")
        row = 0
        for batch in _csv_batches(file, field):
            values = batch.column(0).to_pylist()
            rows: list[Row] = [(row + i, _text(v)) for i, v in enumerate(values) if row + i >= start]
            row += len(values)
            if rows:
                yield rows


def _text(value: Any) -> str | Bad:
    problem = text_problem(value)
    return Bad(problem) if problem is not None else value


def _value(value: Any, mode: Mode) -> str | np.ndarray | Bad:
    if mode == "text":
        return _text(value)
    ids = ids_of(value)
    return Bad(ids) if isinstance(ids, str) else ids


def _jsonl_rows(file: TextFile, field: str, mode: Mode, start: int) -> Iterator[list[Row]]:
    rows: list[Row] = []
    with open(file.path, "rb") as f:
        for row, line in enumerate(f):
            if row < start or not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:  # UnicodeDecodeError too
                rows.append((row, Bad(f"not valid JSON ({err})")))
            else:
                if not isinstance(record, dict):
                    rows.append((row, Bad(f"not a JSON object (a {type(record).__name__})")))
                elif field not in record:
                    rows.append((row, Bad(f"no field {field!r} (its fields: {sorted(record)[:10]})")))
                else:
                    rows.append((row, _value(record[field], mode)))
            if len(rows) >= BATCH:
                yield rows
                rows = []
    if rows:
        yield rows


def _parquet_rows(file: TextFile, field: str, mode: Mode, start: int) -> Iterator[list[Row]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(file.path)
    schema = parquet.schema_arrow
    if field not in schema.names:
        raise ValueError(f"{file.path} has no column {field!r}; its columns are {schema.names}")
    kind = schema.field(field).type
    if mode == "text" and not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ValueError(f"{file.path}: column {field!r} is {kind}, not text")
    if mode == "tokens" and not is_int_list(kind):
        raise ValueError(f"{file.path}: column {field!r} is {kind}, not a list of integer token ids")
    for row, batch in parquet_batches(parquet, [field], start):
        column = batch.column(0)
        yield list(zip(range(row, row + len(column)), _parquet_values(column, mode), strict=True))


def parquet_batches(parquet: Any, columns: list[str], start: int) -> Iterator[tuple[int, Any]]:
    """A ``pyarrow.parquet.ParquetFile``'s ``columns`` from row ``start`` on: ``(first row, record batch)`` pairs.

    Row groups wholly before ``start`` are not read.
    """
    groups, first = [], 0
    for g in range(parquet.num_row_groups):
        rows_in = parquet.metadata.row_group(g).num_rows
        if first + rows_in > start:
            groups.append(g)
        elif not groups:
            first += rows_in
    row = first
    for batch in parquet.iter_batches(batch_size=BATCH, row_groups=groups, columns=columns) if groups else []:
        skip = max(0, start - row)
        if skip < batch.num_rows:
            yield row + skip, batch.slice(skip)
        row += batch.num_rows


def _parquet_values(column: Any, mode: Mode) -> list[str | np.ndarray | Bad]:
    if mode == "text":
        return [_text(v) for v in column.to_pylist()]
    bad = list_problems(column, None)
    offsets = column.offsets.to_numpy()
    child = column.values.fill_null(0) if column.values.null_count else column.values  # null rows are Bad
    values = child.to_numpy(zero_copy_only=False)
    return [Bad(bad[i]) if i in bad else values[offsets[i] : offsets[i + 1]] for i in range(len(column))]


def is_int_list(kind: Any) -> bool:
    """Whether an Arrow type is a list (or large list) of integers."""
    import pyarrow as pa

    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)


def _csv_batches(file: TextFile, field: str) -> Iterator[Any]:
    """The CSV file's ``field`` column, as text, in record batches."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    columns = columns_of(file)
    if field not in columns:
        raise ValueError(f"{file.path} has no column {field!r}; its columns are {columns}")
    reader = pacsv.open_csv(
        file.path,
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(include_columns=[field], column_types={field: pa.string()},
                                             strings_can_be_null=True, quoted_strings_can_be_null=False),
    )
    yield from reader


def is_token_source(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds token ids with no flag to say so: JSON Lines, Parquet with ids, or a folder of them.

    A JSON Lines file counts (no image source is one); a Parquet file, when its schema has an integer-list
    ``input_ids`` or ``tokens`` column (an image file list has ``path`` and ``label``); a folder, when its own files
    (not its subfolders: an image folder's) include one such file. Only a Parquet file's schema is read.
    """
    path = Path(path)
    if path.is_dir():
        with os.scandir(path) as entries:
            files = sorted(Path(e.path) for e in entries if e.is_file() and not e.name.startswith("."))
        return any(_token_file(f) for f in files if f.suffix.lower() in _IN_FOLDERS)
    return path.is_file() and _token_file(path)


def _token_file(path: Path) -> bool:
    kind = FORMATS.get(path.suffix.lower())
    if kind == "jsonl":
        return True
    if kind != "parquet":
        return False
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    return any(name in schema.names and is_int_list(schema.field(name).type) for name in TOKEN_COLUMNS)
