"""The reader of ingested datasets: rows of memory-mapped Arrow IPC shards, zero-copy.

``stallfree ingest`` writes ``shard-NNNNN.arrow`` files, ``labels.npy`` and a ``manifest.json``
(``stallfree.ingest.manifest``). A :class:`ShardReader` finds a row's shard from the manifest's row counts, maps
that shard the first time one of its rows is read, and answers "row i" with a NumPy view straight into the mapping:
no copy, no file open per sample, random access by row. Construction opens no shard (at 100M samples there are
48,829 of them): it reads the manifest and memory-maps ``labels.npy``.

Checks, and when they run:

- **on a shard's first read**, cheap ones: it exists with the manifest's size (a truncated copy is caught here), its
  Arrow footer parses and gives the manifest's schema (column names and types: a damaged footer can rename a
  column), and every record batch passes Arrow's full structural validation (offsets inside their buffers), so a
  damaged file raises :class:`ShardError`, naming it, instead of a ``KeyError`` later or a crash in native code.
- **then**, with ``verify="first-use"`` (the default), its SHA-256 against the manifest's. Hashing every shard on
  open would read the whole dataset before the first batch (minutes for ImageNet); hashing a shard when it is first
  touched costs one sequential read of a file the epoch reads anyway, and an altered shard still fails before any
  of its rows reach the graph. ``verify="open"`` opens and hashes everything on construction; ``"none"`` skips
  hashing.
- ``labels.npy``: its size, dtype and length on construction, and its SHA-256 unless ``verify="none"``.

A file whose checksum matched once is not hashed again while its size and modification time are unchanged:
the verified-once marker (:mod:`.verified`) lets a resumed job, or the next rank on the machine, skip the read.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from stallfree.ingest.labels import load_labels
from stallfree.ingest.manifest import MANIFEST, file_sha256, read_manifest, schema_problem
from stallfree.pipeline.reader_base import BaseReader, Sample
from stallfree.pipeline.verified import is_verified, mark_verified

__all__ = ["VERIFY_MODES", "ShardError", "ShardReader", "Verify", "column_views", "gather_column", "is_shard_folder"]

#: When a shard's SHA-256 is checked: on its first read, all on open, or never.
Verify = Literal["first-use", "open", "none"]
VERIFY_MODES: tuple[str, ...] = get_args(Verify)


class ShardError(OSError):
    """A shard that is missing, truncated or altered; the message names the file and the fix."""


def is_shard_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ingested folder (or its ``manifest.json``)."""
    path = Path(path)
    return (path / MANIFEST).is_file() or (path.name == MANIFEST and path.is_file())


class _Shard:
    """One mapped shard: its batches' offsets and data of one column as NumPy views, and its checksum state.

    The column is ``payload``: the image bytes (binary), or a token shard's ids (a list of integers).
    """

    def __init__(self, folder: Path, entry: dict[str, Any], schema: list[dict[str, str]], payload: str = "image"):
        import pyarrow as pa
        import pyarrow.ipc as ipc

        self.path = folder / entry["file"]
        self.rows, self.sha256 = int(entry["rows"]), entry["sha256"]
        fix = f"run `stallfree verify {folder}`, and ingest again (or restore the file) if it fails"
        if not self.path.is_file():
            raise ShardError(f"{self.path} is listed in {folder / MANIFEST} but missing; {fix}")
        size = self.path.stat().st_size
        if size != entry["bytes"]:
            raise ShardError(f"{self.path} has {size} bytes but the manifest says {entry['bytes']} (truncated?); {fix}")
        try:
            self.map = pa.memory_map(str(self.path))
            reader = ipc.open_file(self.map)
            problem = schema_problem(reader.schema, schema)
            if problem is not None:
                raise ShardError(f"{self.path} {problem} (a damaged footer?); {fix}")
            self.batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            for batch in self.batches:
                batch.validate(full=True)
        except ShardError:
            raise
        except (pa.ArrowException, OSError, ValueError) as err:
            raise ShardError(f"{self.path} is not a valid Arrow shard ({err}); {fix}") from err
        counted = sum(b.num_rows for b in self.batches)
        if counted != self.rows:
            raise ShardError(f"{self.path} holds {counted} rows but the manifest says {self.rows}; {fix}")
        self.fix = fix
        self.checked = False
        self.failure: str | None = None
        self.lock = threading.Lock()
        self.views: list[tuple[np.ndarray, np.ndarray]] = []
        for batch in self.batches:
            self.views.append(column_views(batch.column(payload)))
        self.starts = [0, *itertools.accumulate(b.num_rows for b in self.batches)]  # a list: bisect, no NumPy call

    def check(self) -> None:
        """Compare the shard's SHA-256 with the manifest's, once."""
        if self.checked:
            return
        with self.lock:
            if not self.checked and self.failure is None:
                if is_verified(self.path, self.sha256):
                    self.checked = True
                    return
                digest = hashlib.sha256(memoryview(self._buffer())).hexdigest()
                if digest != self.sha256:  # remembered: with on_error="skip" each of its rows asks again
                    self.failure = f"{self.path}: SHA-256 differs from the manifest's (the shard was altered); "
                    self.failure += self.fix
                else:
                    mark_verified(self.path, self.sha256)
                self.checked = self.failure is None
            if self.failure is not None:
                raise ShardError(self.failure)

    def _buffer(self) -> Any:
        self.map.seek(0)
        return self.map.read_buffer()

    def locate(self, row: int) -> tuple[int, int]:
        """The record batch holding row ``row`` of this shard, and the row's place in it."""
        batch = bisect.bisect_right(self.starts, row) - 1
        return batch, row - self.starts[batch]

    def image(self, row: int) -> np.ndarray:
        """Row ``row`` of this shard's images, a view into the mapping (every reader's per-row read)."""
        batch, i = self.locate(row)
        offsets, data = self.views[batch]
        return data[offsets[i] : offsets[i + 1]]

    def take(self, name: str, rows: np.ndarray) -> Any:
        """Column ``name`` at this shard's ``rows``, as Arrow values (copied out of the mapping)."""
        import pyarrow as pa

        return pa.chunked_array([b.column(name) for b in self.batches]).take(pa.array(rows, pa.int64()))


def column_views(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """A binary or list column's offsets and data as NumPy views into its buffers (row i: ``data[o[i]:o[i+1]]``)."""
    import pyarrow as pa

    large = pa.types.is_large_list(column.type) or pa.types.is_large_binary(column.type)
    offsets = np.frombuffer(column.buffers()[1], np.int64 if large else np.int32)
    offsets = offsets[column.offset : column.offset + len(column) + 1]
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        values = column.values  # the child array, whose rows the offsets index
        data = values.buffers()[1]
        dtype = values.type.to_pandas_dtype()
        if data is None:
            return offsets, np.empty(0, dtype)
        return offsets, np.frombuffer(data, dtype)[values.offset : values.offset + len(values)]
    data = column.buffers()[2]
    return offsets, np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)


def gather_column(rows: np.ndarray, starts: Any, take: Callable[[int, np.ndarray], Any]) -> np.ndarray | list[Any]:
    """A column at global ``rows`` of shards whose first rows are ``starts``, as the readers' ``column`` gives it.

    ``take(shard, local_rows)`` gives one shard's values (:meth:`_Shard.take`; the remote reader fetches the shard
    first), called once per shard the rows touch, so only those shards are opened.
    Numeric columns come as a writable NumPy array (as ``torch.from_numpy`` wants), others as a list.
    """
    import pyarrow as pa

    rows = np.asarray(rows, np.int64)
    shard_of = np.searchsorted(starts, rows, side="right") - 1
    order = np.argsort(shard_of, kind="stable")  # the rows grouped by shard, each group in the asked order
    grouped, shards = rows[order], shard_of[order]
    pieces = [take(int(s), grouped[shards == s] - int(starts[s])) for s in np.unique(shards)] or [take(0, rows)]
    if len(pieces) == 1:  # one shard (or a local folder taken whole): already in the asked order
        taken = pieces[0]
    else:
        back = np.empty_like(order)
        back[order] = np.arange(len(order))  # where each asked row stands among the grouped ones
        whole = pa.concat_arrays([p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p for p in pieces])
        taken = whole.take(pa.array(back, pa.int64()))
    kind = taken.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return np.array(taken.to_numpy(zero_copy_only=False))
    return taken.to_pylist()


class ShardReader(BaseReader):
    """Rows of an ingested folder (the :class:`~stallfree.pipeline.readers.Reader` protocol).

    Construction reads the manifest and ``labels.npy`` (memory-mapped) and opens no shard: a shard is mapped and
    checked when a row of it is first read (or with ``verify="open"``, all of them now). A dataset ingested by an
    older stallfree, without ``labels.npy``, has every shard opened on construction for its label column.

    Args:
        folder: the ingested folder (or its ``manifest.json``).
        verify: ``"first-use"`` (each shard's SHA-256 on its first read), ``"open"`` (all of them now) or
            ``"none"``; a shard verified before and unchanged since is not hashed again (:mod:`.verified`).
            ``labels.npy`` is hashed on construction unless ``"none"`` (it is read from the start).

    Attributes:
        classes: class names, index = label.
        encoded: False for ``--raw`` shards, whose :meth:`read` gives HWC uint8 pixels instead of encoded bytes.
        columns: the names of the shard columns besides ``image`` (``key``, ``label``, ``height``, ``width`` and the
            source's extra columns), for :meth:`column`.

    Raises:
        FileNotFoundError: no manifest.
        ShardError: ``labels.npy`` missing, truncated, altered or not the manifest's array; with ``verify="open"``
            (or an older dataset without ``labels.npy``), a shard missing, truncated, structurally damaged, of
            another schema than the manifest's (or altered, with ``"open"``). Otherwise these shard errors come from
            the first read of one of the shard's rows.
    """

    #: The per-sample column :meth:`read_image` reads, and the column that names a row in :meth:`describe` (a token
    #: shard's are ``tokens`` and ``source``).
    payload = "image"
    key = "key"
    #: The manifest ``kind`` it reads (``ingest.manifest.KINDS``).
    holds = "images"

    def __init__(self, folder: str | os.PathLike[str], verify: Verify = "first-use"):
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
        super().__init__()
        self.reopen_with(folder, verify=verify)  # open files and a lock: it pickles as where it was opened
        folder = Path(folder)
        self.folder = folder.parent if folder.name == MANIFEST else folder
        self.name = str(self.folder)
        self.manifest = read_manifest(self.folder)
        kind = self.manifest.get("kind", "images")
        if kind != self.holds:
            other = {"images": "ShardReader", "tokens": "TokenShardReader"}.get(kind, "its reader")
            raise ValueError(f"{self.folder} holds {kind}, not {self.holds}: open it with {other} (the Loader and "
                             "open_source pick the reader by the manifest's kind)")
        self.classes: list[str] = list(self.manifest["classes"])
        image = self.manifest.get("image") or {"kind": "encoded"}  # a token manifest has none (TokenShardReader)
        shape = image.get("shape")
        self.encoded = image["kind"] == "encoded"
        self.shape = tuple(shape) if shape else None
        self._verify = verify
        self._entries: list[dict[str, Any]] = list(self.manifest["shards"])
        self._open: list[_Shard | None] = [None] * len(self._entries)  # mapped on first use
        self._failed: dict[int, str] = {}  # shards that failed to open: with on_error="skip" each row asks again
        self._lock = threading.Lock()
        # Row lookup without a NumPy call per sample (36 us per read with np.searchsorted): the shards' first rows,
        # from the manifest, as a plain list for bisect; an array of them for the column gathers.
        self._starts = [0, *itertools.accumulate(int(e["rows"]) for e in self._entries)]
        self._start_array = np.asarray(self._starts, np.int64)
        self.columns: Sequence[str] = [c["name"] for c in self.manifest["schema"] if c["name"] != self.payload]
        self._rows = self._starts[-1]
        self._labels = self._read_labels()
        if verify == "open":
            for index in range(len(self._entries)):
                self._shard(index).check()

    def _read_labels(self) -> np.ndarray:
        """``labels.npy`` memory-mapped and checked; for an older dataset without it, the shards' label columns."""
        entry = self.manifest.get("labels")
        if entry is None:  # written by an older stallfree: the same labels, from every shard
            pieces = [b.column("label").to_numpy(zero_copy_only=False) for i in range(len(self._entries))
                      for b in self._shard(i).batches]
            return np.concatenate(pieces).astype(np.int64, copy=False) if pieces else np.empty(0, np.int64)
        return self._column_file(entry)

    def _column_file(self, entry: dict[str, Any]) -> np.ndarray:
        """The array file the manifest's ``entry`` lists (``labels.npy``, ``lengths.npy``), mapped and checked."""
        path = self.folder / entry["file"]
        fix = f"run `stallfree verify {self.folder}`, and ingest (or --merge) again if it fails"
        try:
            labels = load_labels(self.folder, entry, self._rows)
        except OSError as err:
            raise ShardError(f"{err}; {fix}") from err
        if self._verify != "none" and not is_verified(path, entry["sha256"]):
            if file_sha256(path) != entry["sha256"]:
                raise ShardError(f"{path}: SHA-256 differs from the manifest's (the file was altered); {fix}")
            mark_verified(path, entry["sha256"])
        return labels

    def _shard(self, index: int) -> _Shard:
        """Shard ``index``, mapped and structurally checked on its first use."""
        shard = self._open[index]
        if shard is not None:
            return shard
        with self._lock:
            shard = self._open[index]
            if shard is None:
                if index in self._failed:
                    raise ShardError(self._failed[index])
                try:
                    shard = _Shard(self.folder, self._entries[index], self.manifest["schema"], self.payload)
                except ShardError as err:
                    self._failed[index] = str(err)
                    raise
                self._open[index] = shard
        return shard

    def __len__(self) -> int:
        return self._rows

    def labels(self) -> np.ndarray:
        """Every row's label: ``labels.npy`` memory-mapped, read-only, in its stored dtype.

        That is the smallest signed integer type holding the labels; int64 for a dataset without ``labels.npy``
        (read from its shards).
        """
        return self._labels

    def _locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self._rows:
            raise IndexError(f"row {index} out of range for {self._rows} rows in {self.folder}")
        shard = bisect.bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def read(self, index: int) -> Sample:
        """Row ``index``'s fields: ``{"image": ...}`` (:meth:`read_image`)."""
        return {"image": self.read_image(index)}

    def read_image(self, index: int) -> np.ndarray:
        """Row ``index``'s image: encoded bytes (1-D uint8), or HWC uint8 pixels for ``--raw`` shards; no copy.

        Raises:
            ShardError: the row's shard is missing, damaged, or fails its checksum (checked on its first read).
        """
        shard_index, row = self._locate(index)
        shard = self._shard(shard_index)
        if self._verify != "none":
            shard.check()
        image = shard.image(row)
        return image if self.shape is None or self.encoded else image.reshape(self.shape)

    def shard_rows(self) -> list[int]:
        """Rows per shard, in manifest order (the block shuffle's blocks)."""
        return [int(e["rows"]) for e in self._entries]

    def fingerprint(self) -> str:
        """The shards' SHA-256 checksums from the manifest, hashed: the same for a copy of the folder."""
        return hashlib.sha256(" ".join(s["sha256"] for s in self.manifest["shards"]).encode()).hexdigest()

    def describe(self, index: int) -> str:
        """``<folder>/shard-NNNNN.arrow row R (<source key>)``; without the key if the shard does not open."""
        shard_index, row = self._locate(index)
        try:
            shard = self._shard(shard_index)
        except ShardError:  # describing the sample of an error: the shard's own error is the reason given
            return f"{self.folder / self._entries[shard_index]['file']} row {row}"
        batch, i = shard.locate(row)
        key = shard.batches[batch].column(self.key)[i].as_py()
        return f"{shard.path} row {row} ({key})"

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """Column ``name`` at ``rows``: a NumPy array for numeric columns, else a list (``label``: int64).

        Raises:
            KeyError: no such column (the message lists those there are).
            ShardError: a shard of the rows is missing or damaged.
        """
        if name not in self.columns:
            raise KeyError(f"no column {name!r} in {self.folder}; its columns are {self.columns}")
        if name == "label":  # the labels file: no shard opened
            return np.array(self._labels[np.asarray(rows, np.int64)], np.int64)
        return gather_column(rows, self._start_array, lambda shard, local: self._shard(shard).take(name, local))
