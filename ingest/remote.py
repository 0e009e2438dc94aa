"""Remote stores: the client for a URL, whole-object downloads and uploads with bounded retries, a stall timeout.

Both floors that meet a store use this module: the Loader reads shards through it (``stallfree.pipeline``), and
``stallfree ingest``/``verify``/``info`` write and check datasets at a URL (``stallfree.ingest``); it lives on the
lower floor so that there is one client, one retry policy and one :func:`redact`.

The client is **fsspec** (``s3fs`` for ``s3://``, ``gcsfs`` for ``gs://``, its own ``aiohttp`` client for
``http(s)://``, the local file system for ``file://``). It was chosen over ``pyarrow.fs`` because pyarrow has no
HTTP file system (``https://`` is half of the issue), while fsspec gives one interface, one error translation
(missing object: ``FileNotFoundError``) and one ``storage_options`` dictionary for every scheme, as pandas,
Hugging Face datasets and MosaicML Streaming users already pass it.

A download (:func:`download`) reads the object in 8 MiB pieces (a ranged GET each) into a temporary file, hashing as
it goes; the bytes are counted as they arrive, and every request can be cancelled:

- a dropped connection, a client timeout, an HTTP 5xx or 429, or a response that ends early (fewer bytes than the
  manifest's size: a truncated download) is retried after a backoff that doubles from ``retry.backoff`` up to
  ``retry.max_backoff``, at most ``retry.attempts`` tries in all, going on from the bytes already received (a
  ranged read); when they are spent, :class:`RemoteStoreError` names the object and the last error;
- a SHA-256 that differs from the manifest's is :class:`ChecksumMismatch` (the caller downloads once more);
- a 403 or 404, a server that ignores Range, or an object longer than the manifest says is a
  :class:`RemoteStoreError` at once, naming the URL (never a ``FileNotFoundError`` a reader might skip);
- no byte for ``retry.timeout`` seconds is a stall: the thread that waits for the request
  (:func:`stallfree.ingest.fetch.fetch`) cancels it and the try fails, whatever the client does; a store that
  trickles bytes is slow, not stalled;
- Ctrl-C or the end of the program (:func:`stallfree.ingest.fetch.exiting`) cancels every request in flight, so the
  interpreter, which joins the download threads at exit, ends within a poll interval.

No exception of the client is kept in the chain (``__cause__``, ``__context__``) of the errors raised here: its
repr may hold the request's headers (``Authorization``) or a URL with a password. Only its type and its message,
URLs redacted, are carried over.

An upload (:func:`upload`) puts a whole file, tried again on the same transient failures, and then compares the
size the store holds with the local file's; small objects (a manifest) are read whole by :func:`read_object`.
Any other call is tried the same way through :func:`retried`.

URLs in messages go through :func:`redact`: credentials never appear in an error.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from stallfree.core.atomic import atomic_path
from stallfree.ingest.fetch import Progress, Stopped, TooLarge, Unexpected, exiting, fetch, pause, protocols

__all__ = ["ChecksumMismatch", "RemoteStoreError", "Retry", "download", "is_url", "list_objects", "open_store",
           "read_object", "read_range", "redact", "retried", "scrubbed", "transient", "upload"]

#: The optional extra that brings each scheme's client.
_CLIENTS = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"), "http": ("aiohttp", "remote"),
            "https": ("aiohttp", "remote"), "file": ("fsspec", "remote")}
#: Bytes per ranged request of a download: one request per piece (a store's round trip is paid once per piece,
#: not per MiB), and a piece is what a download holds in memory and what a retry may have to fetch again.
_PIECE = 8 << 20
_T = TypeVar("_T")


class RemoteStoreError(RuntimeError):
    """A store that fails: retries spent, a stall, a refused or missing object, a reply that is not what was asked.

    Never skipped by ``on_error="skip"``; the message names the object's (redacted) URL.
    """


class ChecksumMismatch(OSError):
    """A downloaded object whose SHA-256 is not the manifest's."""


@dataclass(frozen=True)
class Retry:
    """How downloads are retried.

    Args:
        attempts: tries per object (the first included), >= 1.
        backoff: seconds before the first retry; it doubles each time, up to ``max_backoff``.
        max_backoff: the longest wait between tries.
        timeout: seconds without a byte after which a try fails (and a waiting reader raises once tries are spent).
    """

    attempts: int = 5
    backoff: float = 0.25
    max_backoff: float = 8.0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise ValueError(f"retries must be an int >= 1 (tries per download), got {self.attempts!r}")
        for name in ("backoff", "max_backoff", "timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                name = "remote_timeout" if name == "timeout" else name  # the Loader keyword it comes from
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")

    def wait(self, failed: int) -> float:
        """Seconds to wait after the ``failed``-th failed try."""
        return float(min(self.max_backoff, self.backoff * 2 ** (failed - 1)))

    def deadline(self) -> float:
        """The longest a download may take to give up: every try stalling, and every wait between them."""
        return self.attempts * self.timeout + sum(self.wait(i) for i in range(1, self.attempts))


def is_url(source: Any) -> bool:
    """Whether ``source`` is a string with a scheme (``s3://``, ``https://``, ``file://``...)."""
    return isinstance(source, str) and "://" in source and source.split("://", 1)[0].isidentifier()


def redact(url: str) -> str:
    """``url`` without user, password and query string (where signed URLs carry their keys)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def scrubbed(err: BaseException) -> str:
    """``err`` as ``Type: message`` with every URL in it redacted: a client's error may quote a signed URL."""
    return f"{type(err).__name__}: {_URL_IN_TEXT.sub(lambda m: redact(m[0]), str(err))}"


def open_store(url: str, storage_options: dict[str, Any], timeout: float) -> tuple[Any, str]:
    """The fsspec file system for ``url`` and the path inside it.

    ``timeout`` becomes the client's connect and read timeout unless ``storage_options`` sets its own, and the
    client's own retries are turned off, so that :class:`Retry` alone decides how often a request is tried.

    Raises:
        ImportError: the scheme's client is not installed (one line naming the extra to install).
        ValueError: a scheme fsspec does not know.
    """
    scheme = url.split("://", 1)[0].lower()
    module, extra = _CLIENTS.get(scheme, ("fsspec", "remote"))
    for name in ("fsspec", module):
        try:
            __import__(name)
        except ImportError:
            raise ImportError(f"reading {scheme}:// data needs {name}: pip install 'stallfree[{extra}]'") from None
    import fsspec

    options = dict(storage_options)
    if scheme == "s3":
        config = dict(options.pop("config_kwargs", {}))
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        config.setdefault("retries", {"max_attempts": 1})
        options["config_kwargs"] = config
    elif scheme in ("gs", "gcs"):
        options.setdefault("requests_timeout", timeout)  # gcsfs retries 5xx itself too (6 tries), under Retry
    elif scheme in ("http", "https"):
        import aiohttp

        client = dict(options.pop("client_kwargs", {}))
        client.setdefault("timeout", aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout))
        options["client_kwargs"] = client
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ValueError as err:  # fsspec: "Protocol not known"
        raise ValueError(f"{redact(url)}: {err}; stallfree reads s3://, gs://, http(s):// and file:// URLs") from err
    if scheme == "s3":
        fs.retries = 1  # s3fs's own loop (a class attribute, not an option) would multiply Retry.attempts
    return fs, path


def transient(err: BaseException) -> bool:
    """Whether a failed request is worth trying again (a dropped connection, a timeout, a 5xx), not a 403/404."""
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(err, (OSError, TimeoutError, EOFError)):
        return True
    try:
        import aiohttp
    except ImportError:
        aiohttp = None  # type: ignore[assignment]
    if aiohttp is not None and isinstance(err, aiohttp.ClientResponseError):
        return err.status >= 500 or err.status == 429
    if aiohttp is not None and isinstance(err, aiohttp.ClientError):
        return True
    try:
        from botocore.exceptions import BotoCoreError
    except ImportError:
        return False
    return isinstance(err, BotoCoreError)


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
                raise _store_error(error, shown)
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


def _clean(err: BaseException, what: str) -> BaseException:
    """A store's failure as a fresh exception naming ``what`` (a redacted URL), with nothing of the client's.

    The client's exceptions may carry credentials in their repr (aiohttp's request headers, a URL's user and
    password), so none of them is kept as ``__cause__`` or ``__context__``: the new one holds its type (a missing
    object stays ``FileNotFoundError``, a refused one ``PermissionError``) and its message, URLs redacted. An
    error that is not the client's (a ``ValueError`` of the caller's own code) is returned as it is.
    """
    reason = scrubbed(err).split(": ", 1)[-1]
    if isinstance(err, RemoteStoreError):
        return err
    if isinstance(err, (Unexpected, Stopped)):
        return RemoteStoreError(f"{what}: {err}")
    if isinstance(err, TooLarge):
        return ValueError(f"{what} {err}")
    if isinstance(err, FileNotFoundError):
        return FileNotFoundError(f"{what}: no such object ({reason})")
    if isinstance(err, PermissionError):
        return PermissionError(f"{what}: access refused ({reason}); check the credentials (storage_options, or the "
                               "environment)")
    if _is_client_error(err):
        return RemoteStoreError(f"{what}: {scrubbed(err)}")
    return err


def _store_error(err: BaseException, what: str) -> BaseException:
    """As :func:`_clean`, but a missing or refused object of a dataset is a :class:`RemoteStoreError` too.

    An object the manifest lists and the store does not give is a store (or dataset) failure, never a sample to
    skip: ``on_error="skip"`` treats ``FileNotFoundError`` and ``PermissionError`` as bad samples.
    """
    cleaned = _clean(err, what)
    if isinstance(cleaned, (FileNotFoundError, PermissionError)):
        return RemoteStoreError(str(cleaned))
    return cleaned


def _is_client_error(err: BaseException) -> bool:
    if isinstance(err, (OSError, EOFError)):
        return True
    try:
        import aiohttp
    except ImportError:
        aiohttp = None  # type: ignore[assignment]
    if aiohttp is not None and isinstance(err, aiohttp.ClientError):
        return True
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return False
    return isinstance(err, (BotoCoreError, ClientError))


def retried(call: Callable[[], _T], what: str, retry: Retry,
            clean: Callable[[BaseException, str], BaseException] = _clean) -> _T:
    """``call()``, tried again after a transient failure (:func:`transient`), at most ``retry.attempts`` tries.

    ``clean`` turns a failure that is not retried into the error raised (:func:`_clean`, or :func:`_store_error`
    where a missing object is a store failure).

    Raises:
        RemoteStoreError: tries spent on transient failures; names ``what`` (a redacted URL) and the last error.
        FileNotFoundError, PermissionError: a missing object or a refused access (not retried), naming ``what``.
        Any other error of ``call`` that is not the client's (a ``ValueError`` of its own), as it is.
    """
    for tries in range(1, retry.attempts + 1):
        error: BaseException
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - transient ones are retried, others raised below
            error = err
        # raised outside the except block: no client exception (credentials in its repr) rides along
        if not transient(error):
            raise clean(error, what)
        if tries == retry.attempts:
            raise RemoteStoreError(f"{what}: {tries} tries failed (the last: {scrubbed(error)})")
        pause(retry.wait(tries))
    raise AssertionError("unreachable")  # the loop returns or raises


def read_object(fs: Any, path: str, url: str, retry: Retry, limit: int | None = None,
                deadline: float | None = None) -> bytes:
    """Object ``path`` (``url`` for messages) whole: for small ones (a manifest), with the retries of a download.

    Args:
        fs: the store's file system (:func:`open_store`).
        path: the object's path in it.
        url: the object's URL, shown redacted in messages.
        retry: how a try is retried, and the stall timeout.
        limit: the most bytes read; a larger object is a ``ValueError`` (what arrived beyond it is not kept).
        deadline: the most seconds one try may take (a store trickling the object is a ``RemoteStoreError``).

    Raises:
        FileNotFoundError: no such object (not retried).
        PermissionError: access refused (not retried).
        ValueError: larger than ``limit``.
        RemoteStoreError: tries spent, or too slow.
    """
    shown = redact(url)
    return retried(lambda: fetch(fs, path, None, Progress(), retry.timeout, limit=limit, deadline=deadline), shown,
                   retry)


def read_range(fs: Any, path: str, url: str, start: int, end: int, retry: Retry) -> bytes:
    """Bytes ``start`` to ``end`` of object ``path`` (``url`` for messages): one ranged GET, retried.

    Raises:
        RemoteStoreError: tries spent, a missing or refused object, or a server that ignores Range.
    """
    return retried(lambda: fetch(fs, path, (start, end), Progress(), retry.timeout), redact(url), retry,
                   clean=_store_error)


def list_objects(fs: Any, root: str, url: str, retry: Retry) -> dict[str, dict[str, Any]]:
    """The objects directly under ``root`` (``url`` for messages), by name, as the store lists them now (not cached).

    Raises:
        RemoteStoreError: tries spent.
    """
    fs.invalidate_cache(root)
    try:
        entries = retried(lambda: fs.ls(root, detail=True), f"listing {redact(url)}", retry)
    except FileNotFoundError:  # nothing there yet
        return {}
    return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: e for e in entries if e.get("type") != "directory"}


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
