"""Ingest to a URL: shards written to a local staging folder, each uploaded once complete, the manifest last.

::

    local ingest into STAGING ─► shard i complete ─► upload URL/shard-i.arrow (a few at once, retried, size checked)
                                                       └ receipt STAGING/.ingest/uploaded/shard-i.json
    every shard uploaded ─► URL/labels.npy, URL/rejected.jsonl ─► URL/manifest.json, last

A part of a split ingest (``--part i/N``) uploads its own shards, then ``labels.part-i-of-N.npy`` and
``manifest.part-i-of-N.json``; ``--merge URL`` (:mod:`~stallfree.ingest.merge`) writes ``manifest.json`` once every
part is there.

A reader that finds the manifest finds every shard it lists. The staging folder is a local ingest's output folder,
so a rerun after a failure or ``kill -9`` resumes there as a local ingest does: shards not written yet are written,
and a shard is uploaded unless its receipt says it was and the store still holds that object (the receipt's size
and ETag, or modification time for ``file://``). A default staging folder (one per URL, in the stallfree cache) is
removed once the manifest is uploaded; one the caller names is kept, a local copy of the dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stallfree.core.atomic import atomic_write
from stallfree.core.home import cache_dir
from stallfree.ingest.manifest import parse_manifest
from stallfree.ingest.remote import (
    RemoteStoreError,
    Retry,
    is_url,
    list_objects,
    open_store,
    read_object,
    redact,
)
from stallfree.ingest.transfer import upload
from stallfree.ingest.writer import RECORDS

__all__ = ["Upload", "default_staging", "upload_target"]

#: Schemes a dataset can be written to (``http(s)://`` is read-only here).
WRITABLE = ("s3", "gs", "gcs", "file")


def default_staging(url: str, storage_options: dict[str, Any] | None = None, part: tuple[int, int] = (0, 1)) -> Path:
    """The staging folder of an ingest to ``url``: one per URL (and endpoint, and part) in the stallfree cache."""
    shared = [redact(url.rstrip("/")), (storage_options or {}).get("endpoint_url")]
    key = json.dumps(shared if part == (0, 1) else [*shared, list(part)])
    return cache_dir() / "ingest" / hashlib.sha256(key.encode()).hexdigest()[:16]


def upload_target(out: str | os.PathLike[str], part: tuple[int, int], staging: str | os.PathLike[str] | None,
                  storage_options: dict[str, Any] | None, retry: Retry | None) -> Upload | None:
    """The uploads of an ingest to ``out`` if it is a URL, else None (refusing the keywords only a URL takes).

    Raises:
        ValueError: ``staging``, ``storage_options`` or ``retry`` for a local ``out``.
    """
    if not is_url(out):
        given = [n for n, v in (("staging", staging), ("storage_options", storage_options), ("retry", retry))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(n + '=' for n in given)} apply to an OUT at a URL (s3://, gs://, file://), "
                             f"but OUT is {str(out)!r}; drop them")
        return None
    return Upload(str(out), staging, storage_options, retry, part=part)


def _receipt_path(staging: Path, name: str) -> Path:
    return staging / RECORDS / "uploaded" / (name.removesuffix(".arrow") + ".json")


def _tag(info: dict[str, Any]) -> str:
    """What changes when a stored object is replaced: its ETag (S3, GCS) or modification time (``file://``)."""
    return str(info.get("ETag") or info.get("etag") or info.get("mtime") or "")


class Upload:
    """The uploads of one ingest to ``url``: shards as they complete (``uploads`` at once), then the manifest.

    Args:
        url: where the dataset goes (``s3://bucket/prefix/``, ``gs://``, ``file://``).
        staging: the local folder shards are written to first (default :func:`default_staging`, removed at the end).
        storage_options: the fsspec file system's options (credentials, ``endpoint_url``...).
        retry: how each upload is retried.
        uploads: concurrent uploads.
        part: the ``(i, N)`` of a split ingest (its default staging folder is its own).

    Raises:
        ValueError: a scheme that cannot be written (``http(s)://``), or ``uploads`` < 1.
        ImportError: the scheme's client is not installed.
    """

    def __init__(self, url: str, staging: str | os.PathLike[str] | None = None,
                 storage_options: dict[str, Any] | None = None, retry: Retry | None = None, uploads: int = 4,
                 part: tuple[int, int] = (0, 1)):
        scheme = url.split("://", 1)[0].lower()
        if scheme not in WRITABLE:
            raise ValueError(f"cannot ingest to {redact(url)}: {scheme}:// is read-only here; ingest to s3://, gs:// "
                             "or file:// (or a local folder, then serve it over HTTP)")
        if not isinstance(uploads, int) or uploads < 1:
            raise ValueError(f"uploads must be an int >= 1 (concurrent uploads), got {uploads!r}")
        self.url = url.rstrip("/")
        self.shown = redact(self.url)
        self.retry = retry or Retry()
        self.fs, root = open_store(self.url, storage_options or {}, self.retry.timeout)
        self.root = root.rstrip("/")
        self.keep = staging is not None
        self.staging = Path(staging) if staging is not None else default_staging(self.url, storage_options, part)
        self.present = 0  # shards the store held already (a rerun)
        self._stored: dict[str, dict[str, Any]] = {}
        self._pool = ThreadPoolExecutor(uploads, thread_name_prefix="stallfree-upload")
        self._pending: list[Future[None]] = []

    def begin(self, digest: str, manifest_name: str) -> None:
        """Before any shard: refuse a URL holding another dataset, and list what the store holds.

        Raises:
            ValueError: the URL holds a manifest of another source or options.
        """
        where = f"{self.url}/{manifest_name}"
        try:
            data = read_object(self.fs, f"{self.root}/{manifest_name}", where, self.retry)
        except FileNotFoundError:
            data = None
        if data is not None and parse_manifest(data, redact(where)).get("plan", {}).get("digest") != digest:
            raise ValueError(f"{self.shown} already holds a dataset of another source or options ({manifest_name}); "
                             "ingest to an empty prefix, or delete that dataset first")
        self._stored = list_objects(self.fs, self.root, self.url, self.retry)

    def shard(self, index: int, record: dict[str, Any]) -> None:
        """Shard ``index`` is complete in the staging folder: upload it, unless the store holds it already.

        Raises:
            RemoteStoreError, OSError: an earlier shard's upload failed (raised here, to stop the ingest early).
        """
        self._raise_failed()
        if self._holds(index, record):
            self.present += 1
            return
        self._pending.append(self._pool.submit(self._put, index, record))

    def _holds(self, index: int, record: dict[str, Any]) -> bool:
        try:
            receipt = json.loads(_receipt_path(self.staging, record["file"]).read_text())
        except (OSError, ValueError):  # no receipt, or a damaged one: upload again, which is always safe
            return False
        stored = self._stored.get(record["file"])
        return (stored is not None and receipt == {"url": self.shown, "sha256": record["sha256"],
                                                   "bytes": record["bytes"], "tag": _tag(stored)}
                and int(stored.get("size", -1)) == record["bytes"])

    def _put(self, index: int, record: dict[str, Any]) -> None:
        name = record["file"]
        try:
            info = upload(self.fs, self.staging / name, f"{self.root}/{name}", f"{self.url}/{name}", self.retry)
        except RemoteStoreError as err:
            raise RemoteStoreError(f"{err}; no manifest was uploaded, and the shards uploaded so far stay: run the "
                                   "ingest again to upload the rest") from err
        receipt = {"url": self.shown, "sha256": record["sha256"], "bytes": record["bytes"], "tag": _tag(info)}
        atomic_write(_receipt_path(self.staging, name), json.dumps(receipt, sort_keys=True).encode())

    def _raise_failed(self) -> None:
        for future in self._pending:
            if future.done() and future.exception() is not None:
                future.result()

    def finish(self, names: list[str]) -> int:
        """Wait for every shard's upload, then upload the staging folder's ``names`` in order (the manifest last).

        Returns the number of shards uploaded by this run. A default staging folder is removed afterwards.

        Raises:
            RemoteStoreError, OSError: an upload failed (naming the shard and URL).
        """
        for future in self._pending:
            future.result()
        for name in names:
            upload(self.fs, self.staging / name, f"{self.root}/{name}", f"{self.url}/{name}", self.retry)
        self.close()
        if not self.keep:
            shutil.rmtree(self.staging, ignore_errors=True)
        return len(self._pending)

    def close(self) -> None:
        """Stop: uploads not started are dropped, those in flight finish (each bounded by its retries)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
