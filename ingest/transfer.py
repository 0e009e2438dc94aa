"""Whole objects to and from a store: a download resumed by ranged reads and checked, an upload checked by size.

A download (:func:`download`) reads the object in 8 MiB pieces (a ranged GET each) into a temporary file, hashing as
it goes; the bytes are counted as they arrive, and every request can be cancelled:

- a dropped connection, a client timeout, an HTTP 5xx or 429, or a response that ends early (fewer bytes than the
  manifest's size: a truncated download) is retried after a backoff that doubles from ``retry.backoff`` up to
  ``retry.max_backoff``, at most ``retry.attempts`` tries in all, going on from the bytes already received (a
  ranged read); when they are spent, :class:`~stallfree.ingest.remote.RemoteStoreError` names the object and the
  last error;
- a SHA-256 that differs from the manifest's is :class:`ChecksumMismatch` (the caller downloads once more);
- a 403 or 404, a server that ignores Range, or an object longer than the manifest says is a
  :class:`~stallfree.ingest.remote.RemoteStoreError` at once, naming the URL (never a ``FileNotFoundError`` a
  reader might skip);
- no byte for ``retry.timeout`` seconds is a stall: the thread that waits for the request
  (:func:`stallfree.ingest.fetch.fetch`) cancels it and the try fails, whatever the client does; a store that
  trickles bytes is slow, not stalled;
- Ctrl-C or the end of the program (:func:`stallfree.ingest.fetch.exiting`) cancels every request in flight, so the
  interpreter, which joins the download threads at exit, ends within a poll interval.

An upload (:func:`upload`) puts a whole file, tried again on the same transient failures, and then compares the
size the store holds with the local file's. The client, the retry policy and the errors are
:mod:`~stallfree.ingest.remote`'s; no exception of the client rides along in the chain of an error raised here.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from pathlib import Path
from typing import Any

from stallfree.core.atomic import atomic_path
from stallfree.ingest.fetch import Progress, Unexpected, exiting, fetch, pause, protocols
from stallfree.ingest.remote import RemoteStoreError, Retry, redact, retried, scrubbed, store_error, transient

__all__ = ["ChecksumMismatch", "download", "upload"]

#: Bytes per ranged request of a download: one request per piece (a store's round trip is paid once per piece,
#: not per MiB), and a piece is what a download holds in memory and what a retry may have to fetch again.
_PIECE = 8 << 20


class ChecksumMismatch(OSError):
    """A downloaded object whose SHA-256 is not the manifest's."""


def download(fs: Any, path: str, url: str, dest: Path, size: int, sha256: str, retry: Retry,
             progress: Progress | None = None) -> None:
    """Fetch object ``path`` (``url`` for messages) of ``size`` bytes into ``dest``, checked against ``sha256``.

    Raises:
        RemoteStoreError: tries spent on transient failures (named, with the last one); a missing object or a refused
            access (404, 403: not retried, and never a skippable sample); a server that ignores Range; an object
            longer than the manifest says; the program exiting (:func:`~stallfree.ingest.fetch.exiting`).
        ChecksumMismatch: the bytes arrived whole but their SHA-256 is not ``sha256``.
    """
    progress = progress or Progress()
    shown = redact(url)
    digest = hashlib.sha256()
    failures: list[str] = []
    # not flushed to disk: every caller keeps the file in a cache that checks its SHA-256 again before using it
    # after a restart (or in a temporary folder), and a flush per shard made each download wait for the disk
    with atomic_path(dest, durable=False) as tmp, open(tmp, "wb") as out:
        received = 0
        while received < size:
            if exiting():
                raise RemoteStoreError(f"download of {shown} was stopped: the program is exiting")
            error: BaseException | None = None
            try:
                received = _read_from(fs, path, received, size, out, digest, progress, retry.timeout)
                if received < size:
                    error = EOFError(f"the response ended after {received} of {size} bytes (truncated)")
            except Exception as err:  # noqa: BLE001 - sorted right below: transient ones are retried, others raised
                error = err
            if error is None:
                continue
            # raised here, outside the except block, so that no exception of the client (whose repr may hold a
            # request's headers or a URL with credentials) rides along as __context__
            if not transient(error):
                raise store_error(error, shown)
            failures.append(scrubbed(error))
            if len(failures) >= retry.attempts:
                raise RemoteStoreError(
                    f"{shown}: {len(failures)} tries failed (the last: {failures[-1]}); check that the store "
                    f"answers, or raise retries=/remote_timeout= for a slow one")
            pause(retry.wait(len(failures)))
        out.flush()
        if digest.hexdigest() != sha256:
            raise ChecksumMismatch(f"{shown}: SHA-256 {digest.hexdigest()[:16]}... differs from the manifest's "
                                   f"{sha256[:16]}... (the object was altered or damaged in transit)")


def _read_from(fs: Any, path: str, offset: int, size: int, out: Any, digest: Any, progress: Progress,
               timeout: float) -> int:
    """Read ``path`` from ``offset`` on into ``out``; the offset reached (less than ``size`` if the reply ended).

    One ranged GET per piece, and no request for the object's size: the manifest gives it, and asking (a HEAD
    before each download, as ``fs.open`` does) would double the round trips of a small shard. The last piece asks
    for one byte more, so an object longer than the manifest says is caught without another request.
    """
    while offset < size:
        wanted = min(_PIECE, size - offset)
        last = offset + wanted == size
        piece = fetch(fs, path, (offset, offset + wanted + (1 if last else 0)), progress, timeout)
        if len(piece) > wanted:
            raise Unexpected(f"the object is longer than the manifest's {size} bytes (it was replaced, or this is "
                              "another dataset); run `stallfree verify` on the dataset's URL")
        out.write(piece)
        digest.update(piece)
        offset += len(piece)
        if len(piece) < wanted:  # the reply ended early: the caller retries from here
            break
    return offset


def upload(fs: Any, local: Path, path: str, url: str, retry: Retry) -> dict[str, Any]:
    """Put file ``local`` at ``path`` (``url`` for messages); returns the stored object's info (size, ETag...).

    An object store (S3, GCS) shows an object only once its upload is complete, so the bytes go to the final name;
    a file system (``file://``) would show a partial file, so they go to a temporary name that is renamed once they
    are all there. Either way the size the store then holds is compared with the file's, and a mismatch is retried:
    a reader never finds a partial object under the final name.

    Raises:
        RemoteStoreError: tries spent on transient failures (or on a stored size that is not the file's).
        FileNotFoundError, PermissionError: as the store answered (a missing bucket, a refused key), naming ``url``.
    """
    size = local.stat().st_size
    shown = redact(url)

    def attempt() -> dict[str, Any]:
        if _is_file_system(fs):
            parent, name = path.rsplit("/", 1)
            fs.makedirs(parent, exist_ok=True)
            tmp = f"{parent}/.{name}.tmp-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}"
            fs.put_file(str(local), tmp)
            fs.mv(tmp, path)
        else:
            fs.put_file(str(local), path)
        fs.invalidate_cache(path)
        info = dict(fs.info(path))
        if int(info.get("size", -1)) != size:
            raise EOFError(f"the store holds {info.get('size')} bytes after the upload of {size} (truncated)")
        return info

    return retried(attempt, f"uploading {local.name} to {shown}", retry)  # its errors name the upload and URL


def _is_file_system(fs: Any) -> bool:
    """Whether ``fs`` is the local file system (``file://``), where a file is visible while it is being written."""
    return "file" in protocols(fs)
