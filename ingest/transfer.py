"""Whole objects to and from a store: a download resumed by ranged reads and checked, an upload checked by size.

A download (:func:`download`) reads the object in 8 MiB pieces (a ranged GET each) into a temporary file, hashing as
it goes; the bytes are counted as they arrive, and every request can be cancelled:

- a dropped connection, a client timeout, an HTTP 5xx or 429, or a response that ends early (fewer bytes than the
  manifest's size: a truncated download) is retried after a backoff that doubles from ``retry.backoff`` up to
  ``retry.max_backoff``, at most ``retry.attempts`` tries in all, going on from the bytes already received (a
  ranged read); when they are spent, :class:`~stallfree.ingest.remote.RemoteStoreError` names the object and the
  last error;
- a SHA-256 that differs from the manifest's is :class:`ChecksumMismatch` (the caller downloads once more);
- a 403 or 404, or an object longer than the manifest says is a :class:`~stallfree.ingest.remote.RemoteStoreError`
  at once, naming the URL (never a ``FileNotFoundError`` a reader might skip);
- a server that ignores Range (a ``200`` with the whole object to a ranged GET, as ``python -m http.server``
  sends) has that body taken as the whole object, checked as any download, and the object is asked for whole from
  then on (:class:`NoRange`);
- no byte for ``retry.timeout`` seconds, or under ``retry.min_rate`` bytes a second over ``retry.rate_window``
  seconds once bytes flow, is a stall: the thread that waits for the request
  (:func:`stallfree.ingest.fetch.fetch`) cancels it and the try fails, whatever the client does; a store that is
  slow but steady is not stalled;
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
from stallfree.ingest.fetch import Progress, TooSlow, Unexpected, exiting, fetch, pause, protocols
from stallfree.ingest.remote import RemoteStoreError, Retry, redact, retried, scrubbed, store_error, transient

__all__ = ["ChecksumMismatch", "NoRange", "download", "upload"]

#: Bytes per ranged request of a download: one request per piece (a store's round trip is paid once per piece,
#: not per MiB), and a piece is what a download holds in memory and what a retry may have to fetch again.
_PIECE = 8 << 20


class ChecksumMismatch(OSError):
    """A downloaded object whose SHA-256 is not the manifest's."""


class NoRange:
    """The objects (paths in a store) whose server answered a ranged request with the whole object.

    A download of one of them asks for it whole, with no Range header (the server would send the whole object for
    every piece, and a retry could not go on from the bytes received). A reader keeps one for its life: a plain GET
    is right for any server, so one that starts to honour Range meanwhile loses nothing but the resumed retry.
    """

    def __init__(self) -> None:
        self._paths: set[str] = set()
        self._lock = threading.Lock()

    def add(self, path: str) -> None:
        with self._lock:
            self._paths.add(path)

    def __contains__(self, path: object) -> bool:
        with self._lock:
            return path in self._paths


def download(fs: Any, path: str, url: str, dest: Path, size: int, sha256: str | None, retry: Retry,
             progress: Progress | None = None, no_range: NoRange | None = None) -> None:
    """Fetch object ``path`` (``url`` for messages) of ``size`` bytes into ``dest``, checked against ``sha256``.

    A server that ignores Range answers the first piece with the whole object (HTTP 200): that body is taken as
    the object, checked as any download (its size, then its SHA-256), and ``path`` joins ``no_range``, so that a
    retry, or a later download of it, asks for it whole. ``sha256`` None: the size alone is checked (a tar).

    Raises:
        RemoteStoreError: tries spent on transient failures (named, with the last one); a missing object or a refused
            access (404, 403: not retried, and never a skippable sample); an object longer than the manifest says;
            the program exiting (:func:`~stallfree.ingest.fetch.exiting`).
        ChecksumMismatch: the bytes arrived whole but their SHA-256 is not ``sha256``.
    """
    progress = progress or Progress()
    no_range = no_range if no_range is not None else NoRange()
    shown = redact(url)
    failures: list[str] = []
    slow = False
    # not flushed to disk: every caller keeps the file in a cache that checks its SHA-256 again before using it
    # after a restart (or in a temporary folder), and a flush per shard made each download wait for the disk
    with atomic_path(dest, durable=False) as tmp, open(tmp, "wb") as out:
        into = _Into(out, size, listed=sha256 is not None)
        while into.received < size:
            if exiting():
                raise RemoteStoreError(f"download of {shown} was stopped: the program is exiting")
            error: BaseException | None = None
            try:
                _read_into(fs, path, into, progress, retry, no_range)
                if into.received < size:
                    error = EOFError(f"the response ended after {into.received} of {size} bytes (truncated)")
            except Exception as err:  # noqa: BLE001 - sorted right below: transient ones are retried, others raised
                error = err
            if error is None:
                continue
            # raised here, outside the except block, so that no exception of the client (whose repr may hold a
            # request's headers or a URL with credentials) rides along as __context__
            if not transient(error):
                raise store_error(error, shown)
            failures.append(scrubbed(error))
            slow = isinstance(error, TooSlow)
            if len(failures) >= retry.attempts:
                hint = ("lower remote_min_rate= (0: no minimum) or raise remote_rate_window= for a link that slow"
                        if slow else "raise retries=/remote_timeout= for a slow one")
                raise RemoteStoreError(f"{shown}: {len(failures)} tries failed (the last: {failures[-1]}); check "
                                       f"that the store answers, or {hint}")
            pause(retry.wait(len(failures)))
        out.flush()
        if sha256 is not None and into.digest.hexdigest() != sha256:
            raise ChecksumMismatch(f"{shown}: SHA-256 {into.digest.hexdigest()[:16]}... differs from the manifest's "
                                   f"{sha256[:16]}... (the object was altered or damaged in transit)")


class _Into:
    """A download's file, the SHA-256 of what it holds and its length; the sink of a reply that is the whole object.

    A whole object's chunks arrive on the client's event loop: each request writes through its own :class:`_Reply`,
    closed (under the lock) once the request ended, so a cancelled request's last chunk cannot land in the next
    one's bytes.
    """

    def __init__(self, out: Any, size: int, listed: bool):
        self.out, self.size, self.listed = out, size, listed  # listed: the size is a manifest's, not the store's
        self.digest = hashlib.sha256()
        self.received = 0
        self.lock = threading.Lock()

    def add(self, chunk: bytes) -> None:
        if self.received + len(chunk) > self.size:
            raise self.longer()
        self.out.write(chunk)
        self.digest.update(chunk)
        self.received += len(chunk)

    def longer(self) -> Unexpected:
        if not self.listed:
            return Unexpected(f"the object is longer than the {self.size} bytes the store gave for it: it changed "
                              "while it was read; try again")
        return Unexpected(f"the object is longer than the manifest's {self.size} bytes (it was replaced, or this is "
                          "another dataset); run `stallfree verify` on the dataset's URL")


class _Reply:
    """One request's way into :class:`_Into` (:class:`~stallfree.ingest.fetch.Sink`); ``whole``: it was used."""

    def __init__(self, into: _Into):
        self.into, self.open, self.whole = into, True, False

    def begin(self) -> None:
        with self.into.lock:
            if not self.open:
                raise Unexpected("the request was cancelled")
            self.whole = True
            self.into.out.seek(0)
            self.into.out.truncate()
            self.into.digest, self.into.received = hashlib.sha256(), 0

    def write(self, chunk: bytes) -> None:
        with self.into.lock:
            if not self.open:
                raise Unexpected("the request was cancelled")
            self.into.add(chunk)

    def close(self) -> None:
        with self.into.lock:
            self.open = False


def _read_into(fs: Any, path: str, into: _Into, progress: Progress, retry: Retry, no_range: NoRange) -> None:
    """Read ``path`` into ``into`` from what it holds on (it may end short: the caller retries from there).

    One ranged GET per piece, and no request for the object's size: the manifest gives it, and asking (a HEAD
    before each download, as ``fs.open`` does) would double the round trips of a small shard. The last piece asks
    for one byte more, so an object longer than the manifest says is caught without another request. An object in
    ``no_range`` is asked for whole; one whose server answers a piece with the whole object joins it.
    """
    while into.received < into.size:
        offset = into.received
        whole = path in no_range
        wanted = min(_PIECE, into.size - offset)
        span = None if whole else (offset, offset + wanted + (1 if offset + wanted == into.size else 0))
        reply = _Reply(into)
        try:
            piece = fetch(fs, path, span, progress, retry.pace, whole=reply)
        finally:
            reply.close()
        if reply.whole:  # the whole object came (asked so, or the server ignored Range): it is all there is
            if not whole:
                no_range.add(path)
            return
        if len(piece) > wanted:
            raise into.longer()
        with into.lock:
            into.add(piece)
        if len(piece) < wanted:  # the reply ended early: the caller retries from here
            return


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
