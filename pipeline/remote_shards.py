"""The reader of an ingested dataset on a remote store: its manifest first, then whole shards through the cache.

``Loader("s3://bucket/train/")`` (or ``https://``, ``gs://``, ``file://``) reads ``manifest.json`` from the URL on
construction; nothing else is fetched until a row is read. Each shard is downloaded whole into the
:class:`~stallfree.pipeline.shard_cache.ShardCache` (by 8 MiB ranges, or in one reply from a server that ignores
Range, as ``python -m http.server`` does), checked against the manifest's SHA-256, memory-mapped and
read exactly as a local shard (:class:`~stallfree.pipeline.shards.ShardReader`'s ``_Shard``, the same structural
checks). The :class:`~stallfree.pipeline.read_ahead.ReadAhead` downloads the shards the coming rows need.

Every row's label comes on construction too, from ``labels.npy`` beside the manifest (2 bytes a row for up to
32,768 classes), checked against the manifest's size and SHA-256. A dataset ingested by an older stallfree has no
``labels.npy``: its labels live in the shards only, so :meth:`labels` is filled shard by shard as each arrives
(``-1`` until then); the Loader reads a row's label only after its image, so it always finds it.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.ingest.labels import parse_labels
from stallfree.ingest.manifest import MANIFEST, read_manifest
from stallfree.ingest.remote import Retry, open_store, read_object, redact
from stallfree.ingest.transfer import NoRange, download
from stallfree.pipeline.read_ahead import ReadAhead
from stallfree.pipeline.reader_base import BaseReader, Sample
from stallfree.pipeline.shard_cache import ShardCache, default_cache_dir
from stallfree.pipeline.shards import ShardError, _Shard, gather_column

__all__ = ["RemoteShardReader"]


class RemoteShardReader(BaseReader):
    """Rows of an ingested dataset at a URL (the :class:`~stallfree.pipeline.readers.Reader` protocol).

    Images; :class:`~stallfree.pipeline.token_readers.RemoteTokenShardReader` reads token shards the same way.

    Args:
        url: the dataset's URL (its folder, or its ``manifest.json``).
        cache_dir: where shards are kept (default :func:`~stallfree.pipeline.shard_cache.default_cache_dir`).
        cache_limit: bytes the cache may hold (``None``: no limit); at least the largest shard.
        storage_options: passed to the fsspec file system (credentials, ``endpoint_url``...).
        downloads: concurrent downloads.
        read_ahead: bytes of coming shards to hold ahead of the reads (default: three quarters of ``cache_limit``,
            which holds two blocks of ``shuffle="block"`` when the cache holds three, or 1 GiB).
        retry: how downloads are retried, and the stall timeout.
        rank: this process's rank: the default ``cache_dir`` is one folder per rank (a folder is one process's).
        manifest: the URL's manifest when it was just read (:func:`open_remote` reads it to pick the reader); a
            copy unpickled elsewhere reads it again.

    Raises:
        FileNotFoundError: no manifest at the URL.
        ValueError: not a stallfree manifest, one of another kind, a ``cache_limit`` smaller than a shard, or a
            ``cache_dir`` another process uses.
        RemoteStoreError: the store did not answer.
    """

    payload = "image"  # the shards' column that holds each row's sample
    holds = "images"  # the manifest's kind
    _labels_from_shards = False  # an image dataset ingested before labels.npy: each shard brings its rows' labels

    def __init__(self, url: str, *, cache_dir: str | Path | None = None, cache_limit: int | None = None,
                 storage_options: dict[str, Any] | None = None, downloads: int = 8, read_ahead: int | None = None,
                 retry: Retry | None = None, rank: int = 0, manifest: dict[str, Any] | None = None):
        super().__init__()
        # Downloads, a cache and threads: it pickles as the URL and keywords, and is opened afresh where it lands.
        self.reopen_with(url, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options,
                         downloads=downloads, read_ahead=read_ahead, retry=retry, rank=rank)
        self.retry = retry or Retry()
        base = url[: -len(MANIFEST)] if url.endswith("/" + MANIFEST) else url
        self.url = base.rstrip("/")
        self.name = redact(self.url)
        self.fs, self._root = open_store(self.url, storage_options or {}, self.retry.timeout)
        self._root = self._root.rstrip("/")
        self.manifest = manifest if manifest is not None else read_manifest(self.url, storage_options, self.retry)
        kind = self.manifest.get("kind", "images")
        if kind != self.holds:
            other = {"images": "RemoteShardReader", "tokens": "RemoteTokenShardReader"}.get(kind, "its reader")
            raise ValueError(f"{self.name} holds {kind}, not {self.holds}: open it with {other} (the Loader and "
                             "open_source pick the reader by the manifest's kind)")
        self.classes: list[str] = list(self.manifest["classes"])
        image = self.manifest.get("image") or {"kind": "encoded"}  # a token manifest has none
        shape = image.get("shape")
        self.encoded = image["kind"] == "encoded"
        self.shape = tuple(shape) if shape else None
        self.columns: Sequence[str] = [c["name"] for c in self.manifest["schema"] if c["name"] != self.payload]
        self._entries: list[dict[str, Any]] = list(self.manifest["shards"])
        self._starts = np.cumsum([0] + [int(e["rows"]) for e in self._entries])
        self._labels = self._read_labels(storage_options or {})
        largest = max((int(e["bytes"]) for e in self._entries), default=0)
        if cache_limit is not None and cache_limit < largest:
            raise ValueError(f"cache_limit={cache_limit} is smaller than the largest shard of {redact(self.url)} "
                             f"({largest} bytes); give at least 2 shards' worth (cache_limit={2 * largest}), more "
                             "for read-ahead")
        self._by_sha = {e["sha256"]: i for i, e in enumerate(self._entries)}
        self.names = [f"shard {e['file']} ({redact(self._url_of(e))})" for e in self._entries]
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir() / f"rank{rank}"
        self.cache = ShardCache.shared(folder, cache_limit, downloads, self.retry)
        self._open: dict[int, _Shard] = {}
        self._lock = threading.Lock()
        self.no_range = NoRange()  # shards whose server ignored Range: asked for whole from then on
        budget = read_ahead if read_ahead is not None else (cache_limit * 3 // 4 if cache_limit else 1 << 30)
        self.read_ahead = ReadAhead(self.cache, self._entries, self._starts, max(budget, largest), self._fetch,
                                    self.names)
        self.cache.subscribe(self._forget, self.read_ahead.wake)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _read_labels(self, storage_options: dict[str, Any]) -> np.ndarray:
        """``labels.npy`` fetched and checked; for an older dataset without it, ``-1`` until each shard arrives."""
        entry = self.manifest.get("labels")
        if entry is None:
            self._labels_from_shards = True
            return np.full(len(self), -1, np.int64)
        return self._column_file(entry)

    def _column_file(self, entry: dict[str, Any]) -> np.ndarray:
        """The array file the manifest's ``entry`` lists (``labels.npy``, ``lengths.npy``), fetched and checked."""
        url = self._url_of(entry)
        data = read_object(self.fs, f"{self._root}/{entry['file']}", url, self.retry, limit=int(entry["bytes"]) + 1)
        try:
            return parse_labels(data, entry, len(self), redact(url))
        except OSError as err:
            raise ShardError(f"{err}; re-upload the dataset's {entry['file']}, or run `stallfree verify "
                             f"{redact(self.url)}`") from err

    def _url_of(self, entry: dict[str, Any]) -> str:
        return f"{self.url}/{entry['file']}"

    def _fetch(self, sha256: str, dest: Path, progress: Any) -> None:
        entry = self._entries[self._by_sha[sha256]]
        path = f"{self._root}/{entry['file']}"
        download(self.fs, path, self._url_of(entry), dest, int(entry["bytes"]), sha256, self.retry, progress,
                 self.no_range)

    def _forget(self, sha256: str) -> None:
        """The cache evicted a shard: drop its mapping (views already handed out stay valid)."""
        if sha256 in self._by_sha:  # the cache may be shared with a Loader of another dataset
            self._open.pop(self._by_sha[sha256], None)

    def shard_rows(self) -> list[int]:
        """Rows per shard, in manifest order (the block shuffle's blocks)."""
        return [int(e["rows"]) for e in self._entries]

    def follow(self, rows: np.ndarray) -> None:
        """The rows this rank reads next, in order: the read-ahead downloads their shards ahead.

        A new pass (an epoch, or a resumed position) asks the store again for shards whose download failed before;
        within a pass, a failed shard is remembered with its error and not asked for again.
        """
        self.cache.forget(set(self._by_sha))
        self.read_ahead.follow(rows)

    def labels(self) -> np.ndarray:
        """Every row's label, from ``labels.npy`` (its stored dtype).

        For an older dataset without it: int64, filled as each shard arrives (``-1`` for rows not fetched yet).
        """
        return self._labels

    def _locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} rows in {redact(self.url)}")
        shard = int(np.searchsorted(self._starts, index, side="right")) - 1
        return shard, index - int(self._starts[shard])

    def _acquire(self, shard: int) -> _Shard:
        """Shard ``shard`` mapped and pinned in the cache (release it with ``cache.release``)."""
        entry = self._entries[shard]
        mapped = self._open.get(shard)  # mapped and still in the cache (an eviction forgets it): pin it, no more
        if mapped is not None and self.cache.pin(entry["sha256"]):
            return mapped
        path = self.cache.acquire(entry["sha256"], int(entry["bytes"]), self._fetch, self.names[shard])
        with self._lock:
            mapped = self._open.get(shard)
            if mapped is None:
                try:
                    mapped = _Shard(path.parent, {**entry, "file": path.name}, self.manifest["schema"], self.payload)
                except ShardError as err:
                    self.cache.release(entry["sha256"])
                    raise ShardError(f"shard {entry['file']} ({redact(self._url_of(entry))}): {err}") from err
                mapped.checked = True  # the cache checked its SHA-256 when it arrived
                if self._labels_from_shards:  # an older dataset: its labels come with its shards
                    first = int(self._starts[shard])
                    self._labels[first : first + mapped.rows] = _label_column(mapped)
                self._open[shard] = mapped
        return mapped

    def read(self, index: int) -> Sample:
        """Row ``index``'s fields: ``{"image": ...}`` (:meth:`read_image`)."""
        return {self.payload: self.read_image(index)}

    def read_image(self, index: int) -> np.ndarray:
        """Row ``index``'s image (as :meth:`ShardReader.read_image`), its shard fetched first if it is not cached.

        Raises:
            ShardError: the row's shard failed its checksum twice, or is damaged (names the shard and URL).
            RemoteStoreError: the store did not answer.
        """
        shard, row = self._locate(index)
        sha256 = self._entries[shard]["sha256"]
        mapped = self._acquire(shard)
        try:
            data = mapped.image(row)  # a view into the mapping: it stays valid after an eviction unlinks the file
        finally:
            self.cache.release(sha256)
            self.read_ahead.advance()
        return data if self.shape is None or self.encoded else data.reshape(self.shape)

    def fingerprint(self) -> str:
        """As :meth:`ShardReader.fingerprint`: the same for the dataset on local disk, so a state moves across."""
        return hashlib.sha256(" ".join(s["sha256"] for s in self.manifest["shards"]).encode()).hexdigest()

    def describe(self, index: int) -> str:
        """``<url>/shard-NNNNN.arrow row R``."""
        shard, row = self._locate(index)
        return f"{redact(self._url_of(self._entries[shard]))} row {row}"

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """Column ``name`` at ``rows`` (their shards fetched if needed), as :meth:`ShardReader.column`.

        Raises:
            KeyError: no such column (the message lists those there are).
        """
        if name not in self.columns:
            raise KeyError(f"no column {name!r} in {redact(self.url)}; its columns are {self.columns}")
        rows = np.asarray(rows, np.int64)
        if name == "label" and (len(rows) == 0 or self._labels[rows].min() >= 0):
            return np.array(self._labels[rows], np.int64)

        def take(shard: int, local: np.ndarray) -> Any:
            mapped = self._acquire(shard)
            try:
                return mapped.take(name, local)  # copied out: the shard may go once released
            finally:
                self.cache.release(self._entries[shard]["sha256"])

        return gather_column(rows, self._starts, take)

    def close(self) -> None:
        """Stop the read-ahead (downloads in flight finish; the cache may serve other Loaders)."""
        self.read_ahead.close()


def _label_column(mapped: _Shard) -> np.ndarray:
    return np.concatenate([b.column("label").to_numpy(zero_copy_only=False) for b in mapped.batches])
