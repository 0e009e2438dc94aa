"""Readers of token sequences: ingested token shards, and Parquet, JSON Lines and Hugging Face datasets in place.

Each is a :class:`~stallfree.pipeline.reader_base.BaseReader` of the token kind (``fields = TOKEN_FIELDS``): ``read(i)``
gives ``{"tokens": ids}`` (a 1-D integer array), :meth:`lengths` every document's length without reading a token,
and ``labels()`` zeros (a token sample has no class; the Reader protocol asks for labels).

- :class:`TokenShardReader`: a folder ``stallfree ingest`` wrote (``"kind": "tokens"``): ``lengths.npy`` at open,
  each shard memory-mapped and checked on first use, as image shards are; ids are views into the mapping.
- :class:`TokenFileReader`: a Parquet file with an integer-list column (``input_ids``, else ``tokens``, or the one
  named), read once into Arrow, ids are views into its buffers; a JSON Lines file, parsed once; or a folder of them.
- :class:`HuggingFaceTokenReader`: a ``datasets.Dataset`` with ``input_ids``: views into its memory-mapped Arrow
  table (a dataset with an indices mapping, after ``shuffle``/``select``, is taken through it once: a copy).

The in-place readers check every document when they open (:mod:`~stallfree.ingest.token_check`, the check ingest
applies): a null, an empty document, a null or negative id, an id at or beyond ``vocab_size`` when it is known.
``on_error="raise"`` raises a ``ValueError`` naming the file and row; ``"skip"`` leaves the row out of the reader's
rows and lists it in :attr:`rejected` (``{"path": "FILE:ROW", "reason"}``), as ingest's ``rejected.jsonl`` does.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from stallfree.ingest.fields import TOKEN_FIELDS, Field
from stallfree.ingest.manifest import read_manifest
from stallfree.ingest.text_sources import (
    TOKEN_COLUMNS,
    Bad,
    TextFile,
    columns_of,
    is_int_list,
    list_text_files,
    read_rows,
)
from stallfree.ingest.token_check import list_problems
from stallfree.pipeline.hf_reader import is_hf_dataset
from stallfree.pipeline.reader_base import BaseReader, Sample
from stallfree.pipeline.shards import ShardReader, Verify, column_views, is_shard_folder

__all__ = [
    "HuggingFaceTokenReader", "TokenFileReader", "TokenKind", "TokenShardReader", "is_token_dataset", "is_token_folder",
]

OnError = Literal["raise", "skip"]


class TokenKind:
    """What every token reader answers the same way, from its lengths and :meth:`read_tokens`."""

    fields: Sequence[Field] = TOKEN_FIELDS
    encoded = False
    _lengths: np.ndarray

    def __len__(self) -> int:
        return len(self._lengths)

    def lengths(self) -> np.ndarray:
        """Every document's length (int64), in row order, without reading a token."""
        return self._lengths

    def labels(self) -> np.ndarray:
        """Zeros, one per row (read-only, 8 bytes in all): a token sample has no class; the Reader protocol asks."""
        return np.broadcast_to(np.zeros(1, np.int64), (len(self._lengths),))

    def read_tokens(self, index: int) -> np.ndarray:
        """Row ``index``'s token ids."""
        raise NotImplementedError

    def read(self, index: int) -> Sample:
        """Row ``index``'s fields: ``{"tokens": ...}`` (:meth:`read_tokens`)."""
        return {"tokens": self.read_tokens(index)}


class TokenShardReader(TokenKind, ShardReader):
    """Rows of a token-shard folder ``stallfree ingest`` wrote: ids as views into the memory-mapped shards.

    Opens as :class:`~stallfree.pipeline.shards.ShardReader` does (the manifest and ``lengths.npy`` now, checked;
    each shard mapped, structurally checked and hashed on its first read, as ``verify`` says), and pickles as its
    folder. Its :attr:`columns` are ``length`` and ``source`` (``"FILE:ROW"`` of the input row).

    Attributes:
        vocab_size: the vocabulary's size the ingest checked ids against (None when it knew none).
        token_dtype: the shards' id type, ``uint16`` or ``int32``.

    Raises:
        FileNotFoundError: no manifest.
        ValueError: the folder holds images.
        ShardError: ``lengths.npy`` missing, truncated or altered (and shard errors as ShardReader raises them).
    """

    payload = "tokens"
    key = "source"
    holds = "tokens"

    def __init__(self, folder: str | os.PathLike[str], verify: Verify = "first-use"):
        super().__init__(folder, verify)
        self.encoded = False  # ShardReader's image default, for a manifest without an image entry
        self.vocab_size: int | None = self.manifest["vocab_size"]
        self.token_dtype = np.dtype(self.manifest["token_dtype"])

    def _read_labels(self) -> np.ndarray:
        # called by ShardReader.__init__: the lengths file is this kind's column file (labels are zeros)
        self._lengths = np.asarray(self._column_file(self.manifest["lengths"]), np.int64)
        return self.labels()

    def read_tokens(self, index: int) -> np.ndarray:
        """Row ``index``'s ids (uint16 or int32), a view into the shard's mapping.

        Raises:
            ShardError: its shard is missing, damaged, or fails its checksum.
        """
        return self.read_image(index)

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """Column ``name`` (``length``, ``source``) at ``rows``; ``length`` from ``lengths.npy``, no shard opened."""
        if name == "length":
            return np.array(self._lengths[np.asarray(rows, np.int64)], np.int64)
        return super().column(name, rows)


class _ListRows:
    """Rows of Arrow list-of-integer chunks, as NumPy views into their buffers."""

    def __init__(self, chunks: Sequence[Any]):
        self.views = [column_views(chunk) for chunk in chunks]
        self.starts = [0, *itertools.accumulate(len(chunk) for chunk in chunks)]

    def lengths(self) -> np.ndarray:
        pieces = [np.diff(offsets).astype(np.int64) for offsets, _ in self.views]
        return np.concatenate(pieces) if pieces else np.empty(0, np.int64)

    def row(self, index: int) -> np.ndarray:
        chunk = bisect.bisect_right(self.starts, index) - 1
        offsets, values = self.views[chunk]
        i = index - self.starts[chunk]
        return values[offsets[i] : offsets[i + 1]]


class _InPlace(TokenKind, BaseReader):
    """A token reader over list columns read in place: the check at open, the rows kept, and where a row came from."""

    def _open(self, chunks: list[Any], where: list[tuple[str, int, np.ndarray | None]], vocab_size: int | None,
              on_error: OnError, unread: dict[int, str] | None = None) -> None:
        """Check ``chunks`` and keep the good rows.

        ``where`` is each part's name, first column row and its rows' own numbers (None: 0, 1, ...); ``unread``,
        the column rows that never became a list (a JSON line that is no document), with the reason.
        """
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.classes = []
        self.vocab_size = vocab_size
        self._where = where
        self._firsts = [first for _, first, _ in where]
        self._paths = getattr(self, "_paths", [name for name, _, _ in where])
        self._column = _ListRows(chunks)
        bad: dict[int, str] = {}
        for chunk, start in zip(chunks, self._column.starts, strict=False):
            bad.update({start + row: reason for row, reason in list_problems(chunk, vocab_size).items()})
        bad.update(unread or {})
        if bad and on_error == "raise":
            row, reason = min(bad.items())
            raise ValueError(f"{self._place(row, ' row ', shown=True)}: {reason}; fix it, or pass on_error='skip' to "
                             "leave such rows out (listed in the reader's rejected)")
        self.rejected = [{"path": self._place(row, ":"), "reason": reason} for row, reason in sorted(bad.items())]
        every = self._column.lengths()
        self._rows = np.setdiff1d(np.arange(len(every)), np.fromiter(bad, np.int64, len(bad))) if bad else None
        self._lengths = every[self._rows] if self._rows is not None else every

    def _place(self, row: int, sep: str, shown: bool = False) -> str:
        """Column row ``row`` as ``FILE{sep}ROW``, the file's own row number (``shown``: the file's whole path)."""
        part = bisect.bisect_right(self._firsts, row) - 1
        name, first, numbers = self._where[part]
        name = self._paths[part] if shown else name
        return f"{name}{sep}{int(numbers[row - first]) if numbers is not None else row - first}"

    def _at(self, index: int) -> int:
        if not 0 <= index < len(self._lengths):
            raise IndexError(f"row {index} out of range for {len(self._lengths)} rows in {self.name}")
        return int(self._rows[index]) if self._rows is not None else index

    def read_tokens(self, index: int) -> np.ndarray:
        """Row ``index``'s ids, a view into the Arrow buffers (no copy)."""
        return self._column.row(self._at(index))

    def describe(self, index: int) -> str:
        """``FILE row R`` (for a dataset, ``datasets.Dataset:FINGERPRINT row R``)."""
        return self._place(self._at(index), " row ")

    def fingerprint(self) -> str:
        """The source's identity (:attr:`name`, and each file's name and size) and every length, hashed."""
        digest = hashlib.sha256(f"{type(self).__qualname__}:{self._identity}:".encode())
        digest.update(np.ascontiguousarray(self._lengths, np.int64).tobytes())
        return digest.hexdigest()

    _identity = ""


class TokenFileReader(_InPlace):
    """A Parquet or JSON Lines file (or a folder of them) with an integer-list column of token ids, read in place.

    A Parquet file is read once into Arrow (memory-mapped) and each row's ids are a view into its buffers; a JSON
    Lines file is parsed once into one array of ids (JSON holds no binary ids to map). Rows are each file's own:
    ``describe`` and :attr:`rejected` name ``FILE row R`` (a JSON Lines file's row ``R`` is its line ``R + 1``).

    Args:
        path: a ``.parquet`` or ``.jsonl``/``.json`` file, or a folder of them (its own files, sorted by name).
        tokens_field: the column of ids (default ``input_ids``, else ``tokens``).
        vocab_size: refuse ids at or beyond it (default: unchecked, but for negative ids and ids over int32).
        on_error: a bad row raises (``"raise"``) or is left out and listed in :attr:`rejected` (``"skip"``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a CSV file, no column of ids (the message lists the columns; text is ingested with ``stallfree
            ingest --tokenizer``), a column of another type, or a bad row under ``on_error="raise"`` (file and row).
    """

    def __init__(self, path: str | os.PathLike[str], tokens_field: str | None = None, vocab_size: int | None = None,
                 on_error: OnError = "raise"):
        super().__init__()
        self.reopen_with(path, tokens_field=tokens_field, vocab_size=vocab_size, on_error=on_error)
        self.name = str(path)
        files = list_text_files(path)
        field = tokens_field or _token_column(files[0])
        chunks: list[Any] = []
        where: list[tuple[str, int, np.ndarray | None]] = []
        unread: dict[int, str] = {}
        first = 0
        for file in files:
            parts, numbers, lines = _file_chunks(file, field)
            unread.update({first + row: reason for row, reason in lines.items()})
            where.append((file.name, first, numbers))
            chunks += parts
            first += sum(len(p) for p in parts)
        self._identity = repr([(f.name, f.size) for f in files])
        self._paths = [str(f.path) for f in files]
        self.field = field
        self._open(chunks, where, vocab_size, on_error, unread)


def _token_column(file: TextFile) -> str:
    if file.format == "csv":
        raise ValueError(f"{file.path}: a CSV file holds text; read token ids from a Parquet or JSON Lines file, or "
                         "ingest the text with `stallfree ingest SRC OUT --tokenizer PATH`")
    columns = columns_of(file)
    found = next((name for name in TOKEN_COLUMNS if name in columns), None)
    if found is None:
        text = " (it holds text: `stallfree ingest SRC OUT --tokenizer PATH` tokenizes it)" if "text" in columns else ""
        raise ValueError(f"{file.path} has no column of token ids ({' or '.join(TOKEN_COLUMNS)}); its columns are "
                         f"{columns}{text}: name one with tokens_field=")
    return found


def _file_chunks(file: TextFile, field: str) -> tuple[list[Any], np.ndarray | None, dict[int, str]]:
    """A file's list chunks, its rows' own numbers (None: 0, 1, ...), and its rows that are no list (by chunk row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if file.format == "csv":
        _token_column(file)
    if file.format == "parquet":
        schema = pq.read_schema(file.path)
        if field not in schema.names:
            raise ValueError(f"{file.path} has no column {field!r}; its columns are {schema.names}")
        if not is_int_list(schema.field(field).type):
            raise ValueError(f"{file.path}: column {field!r} is {schema.field(field).type}, not a list of integer "
                             "token ids")
        return list(pq.read_table(file.path, columns=[field], memory_map=True).column(field).chunks), None, {}
    numbers: list[int] = []
    documents: list[np.ndarray] = []
    unread: dict[int, str] = {}
    for batch in read_rows(file, field, "tokens"):
        for row, value in batch:
            if isinstance(value, (Bad, str)):
                unread[len(numbers)] = value.reason if isinstance(value, Bad) else "not a list of token ids"
                value = np.zeros(1, np.int64)  # a placeholder row, never read: it is rejected
            numbers.append(row)
            documents.append(value)
    offsets = np.zeros(len(documents) + 1, np.int64)
    np.cumsum([len(d) for d in documents], out=offsets[1:])
    values = np.concatenate(documents).astype(np.int64) if documents else np.empty(0, np.int64)
    chunk = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    return [chunk], np.asarray(numbers, np.int64), unread


def _hf_refusal(dataset: Any) -> str | None:
    kind = type(dataset).__name__
    if kind.endswith("DatasetDict"):
        return f"a datasets.{kind} holds the splits {list(dataset)}, not one dataset: pass one, as in ds['train']"
    if kind == "IterableDataset":
        return ("a streamed datasets.IterableDataset has no random access: load it map-style, or write it with "
                "ds.to_parquet(path) and read that")
    if (getattr(dataset, "format", None) or {}).get("type") == "custom":
        return ("the datasets.Dataset has a transform (with_transform / set_transform), which the Loader would not "
                "run: it reads the token ids from Arrow; pass the dataset without it (ds.reset_format())")
    return None


class HuggingFaceTokenReader(_InPlace):
    """A Hugging Face ``datasets.Dataset`` with a column of token ids (``input_ids``), read in place.

    The ids are views into the dataset's Arrow table (memory-mapped from its cache files): no copy. A dataset with an
    indices mapping (after ``shuffle``, ``select``, ``train_test_split``) is taken through it once, which copies
    the column; ``ds.flatten_indices()`` first writes it without one. The dataset's row order is the source's.

    Args:
        dataset: a map-style ``datasets.Dataset``.
        tokens_field: the column of ids (default ``input_ids``, else ``tokens``).
        vocab_size: refuse ids at or beyond it (default: unchecked, but for negative ids and ids over int32).
        on_error: a bad row raises (``"raise"``) or is left out and listed in :attr:`rejected` (``"skip"``).

    Raises:
        TypeError: a ``DatasetDict``, a streamed ``IterableDataset`` or a dataset with a Python transform (named).
        ValueError: no column of ids (the message lists the columns), one of another type, or a bad row under
            ``on_error="raise"``.
    """

    def __init__(self, dataset: Any, tokens_field: str | None = None, vocab_size: int | None = None,
                 on_error: OnError = "raise"):
        super().__init__()
        refusal = _hf_refusal(dataset)
        if refusal is not None:
            raise TypeError(refusal)
        self.reopen_with(dataset, tokens_field=tokens_field, vocab_size=vocab_size, on_error=on_error)
        self.name = f"datasets.Dataset:{getattr(dataset, '_fingerprint', '')}"
        mapped = getattr(dataset, "_indices", None) is not None
        table = dataset.with_format("arrow")[:] if mapped else dataset.data.table  # the mapping applied: a copy
        names = list(table.column_names)
        field = tokens_field or next((n for n in TOKEN_COLUMNS if n in names), None)
        if field is None or field not in names:
            raise ValueError(f"the datasets.Dataset has no column {field or ' or '.join(TOKEN_COLUMNS)} of token ids; "
                             f"its columns are {names}: name one with tokens_field=")
        kind = table.schema.field(field).type
        if not is_int_list(kind):
            raise ValueError(f"the datasets.Dataset's column {field!r} is {kind}, not a list of integer token ids")
        self.field = field
        self._identity = self.name
        self._open(list(table.column(field).chunks), [(self.name, 0, None)], vocab_size, on_error)


def is_token_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ingested folder of token shards (its manifest's ``kind`` is ``tokens``)."""
    return is_shard_folder(path) and read_manifest(Path(path).parent if Path(path).name == "manifest.json"
                                                   else path).get("kind") == "tokens"


def is_token_dataset(dataset: Any) -> bool:
    """Whether a Hugging Face dataset is of token sequences: an integer-list ``input_ids``/``tokens``, no image."""
    if not is_hf_dataset(dataset) or type(dataset).__name__ != "Dataset":
        return False
    features = getattr(dataset, "features", None) or {}
    if any(type(feature).__name__ == "Image" for feature in features.values()):
        return False
    schema = dataset.data.schema
    return any(name in schema.names and is_int_list(schema.field(name).type) for name in TOKEN_COLUMNS)
