"""WebDataset tars whose server ignores Range: each fetched whole, once, into a local folder, and read from there.

A server that ignores Range (``python -m http.server``, the commonest quick server) answers a ranged GET with
``200`` and the whole tar, so a sample's read would cost the whole tar. A
:class:`~stallfree.pipeline.webdataset.WebDatasetReader` that meets one (walking a tar's headers, reading a sample,
or reading ahead: the request is closed before its body is read) asks that tar for no more ranges: it
fetches the tar whole (:func:`~stallfree.ingest.transfer.download`, with its retries, stall rules and a check of the
size the store gave) into a :class:`~stallfree.pipeline.shard_cache.ShardCache` of its own, bounded by
``cache_limit`` (least recently used tars evicted), and reads the tar's samples from there. A tar larger than
``cache_limit`` is a :class:`~stallfree.ingest.remote.RemoteStoreError` naming it and the ways out.

The folder is the reader's own (``whole-tars/`` in the index cache), removed when the reader is collected or the
program ends; one that a killed process left is removed by the next reader that finds its lock free.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from stallfree.ingest.fetch import Progress
from stallfree.ingest.remote import RemoteStoreError, Retry
from stallfree.ingest.transfer import NoRange, download
from stallfree.pipeline.shard_cache import ShardCache

__all__ = ["WholeTars"]

#: A folder younger than this is never swept: its owner may not hold its lock yet.
_SWEEP_AGE = 60.0


class WholeTars:
    """Tars at a URL whose server ignores Range, fetched whole into a bounded folder (see the module docstring).

    Args:
        index_dir: the reader's index cache; the folder is made in its ``whole-tars/``.
        limit: bytes the folder may hold (``cache_limit``; ``None``: no limit).
        retry: the downloads' retries and stall rules.
        downloads: tars fetched at once.
    """

    def __init__(self, index_dir: Path, limit: int | None, retry: Retry, downloads: int):
        self.limit, self.retry = limit, retry
        self.no_range = NoRange()  # the tars asked for no more ranges
        parent = Path(index_dir) / "whole-tars"
        parent.mkdir(parents=True, exist_ok=True)
        _sweep(parent)
        self.folder = Path(tempfile.mkdtemp(dir=parent, prefix=f"pid{os.getpid()}-"))
        self.cache = ShardCache(self.folder, limit, downloads, retry)
        weakref.finalize(self, _remove, self.cache, self.folder)

    @contextlib.contextmanager
    def opened(self, fs: Any, path: str, shown: str, size: int, stamp: str) -> Iterator[IO[bytes]]:
        """The tar ``path`` (``shown`` in messages; ``size`` bytes, ``stamp`` its ETag or time) open, fetched first.

        Raises:
            RemoteStoreError: the tar is larger than ``cache_limit``, or its download failed (named).
        """
        if self.limit is not None and size > self.limit:
            raise RemoteStoreError(f"{shown}: the server ignores Range (it answered a ranged request with the whole "
                                   f"tar), so the tar is read whole, but its {size} bytes exceed cache_limit="
                                   f"{self.limit}; give cache_limit={size} or more, serve the tars from a server "
                                   "that supports Range (nginx, a CDN, an object store), or ingest them")
        self.no_range.add(path)
        key = hashlib.sha256(f"{shown}\0{size}\0{stamp}".encode()).hexdigest()  # a changed tar is another file

        def fetch(_: str, dest: Path, progress: Progress) -> None:
            download(fs, path, shown, dest, size, None, self.retry, progress, self.no_range)

        local = self.cache.acquire(key, size, fetch, f"tar {shown}")
        try:
            with open(local, "rb") as f:
                yield f
        finally:
            self.cache.release(key)

    def read(self, fs: Any, path: str, shown: str, size: int, stamp: str, offset: int, length: int) -> bytes:
        """Bytes ``offset`` to ``offset + length`` of the tar (as :meth:`opened`)."""
        with self.opened(fs, path, shown, size, stamp) as f:
            f.seek(offset)
            return f.read(length)


def _remove(cache: ShardCache, folder: Path) -> None:
    cache.close()
    shutil.rmtree(folder, ignore_errors=True)


def _sweep(parent: Path) -> None:
    """Remove the folders of ``parent`` that no process holds (their owner was killed)."""
    for folder in parent.iterdir():
        lock = folder / ".lock"
        try:
            if time.time() - folder.stat().st_mtime < _SWEEP_AGE or not lock.is_file():
                continue
            with open(lock, "a+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # held (BlockingIOError), or removed meanwhile by another sweep
            continue
