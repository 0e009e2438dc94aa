"""Remote stores: the client for a URL, whole-object downloads and uploads with bounded retries, a stall timeout.

Both floors that meet a store use this module: the Loader reads shards through it (``stallfree.pipeline``), and
``stallfree ingest``/``verify``/``info`` write and check datasets at a URL (``stallfree.ingest``); it lives on the
lower floor so that there is one client, one retry policy and one :func:`redact`.

The client is **fsspec** (``s3fs`` for ``s3://``, ``gcsfs`` for ``gs://``, its own ``aiohttp`` client for
``http(s)://``, the local file system for ``file://``). It was chosen over ``pyarrow.fs`` because pyarrow has no
HTTP file system (``https://`` is half of the issue), while fsspec gives one interface, one error translation
(missing object: ``FileNotFoundError``) and one ``storage_options`` dictionary for every scheme, as pandas,
Hugging Face datasets and MosaicML Streaming users already pass it.

A download (:func:`download`) reads the object in 1 MiB pieces into a temporary file, hashing as it goes:

- a dropped connection, a client timeout, an HTTP 5xx or 429, or a response that ends early (fewer bytes than the
  manifest's size: a truncated download) is retried after a backoff that doubles from ``retry.backoff`` up to
  ``retry.max_backoff``, at most ``retry.attempts`` tries in all, going on from the bytes already received (a
  ranged read); when they are spent, :class:`RemoteStoreError` names the object and the last error;
- a SHA-256 that differs from the manifest's is :class:`ChecksumMismatch` (the caller downloads once more);
- no byte for ``retry.timeout`` seconds is a stall: the piece's client call gets that timeout, and the watchdog
  in :class:`Progress` lets a waiting reader raise even if the client itself hangs.

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
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from stallfree.ingest.atomic import atomic_path

__all__ = ["ChecksumMismatch", "Progress", "RemoteStoreError", "Retry", "download", "is_url", "list_objects",
           "open_store", "read_object", "redact", "retried", "scrubbed", "transient", "upload"]

#: The optional extra that brings each scheme's client.
_CLIENTS = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"), "http": ("aiohttp", "remote"),
            "https": ("aiohttp", "remote"), "file": ("fsspec", "remote")}
#: Bytes per ranged request of a download: one request per piece (a store's round trip is paid once per piece,
#: not per MiB), and a piece is what a download holds in memory and what a retry may have to fetch again.
_PIECE = 8 << 20
_T = TypeVar("_T")


class RemoteStoreError(RuntimeError):
    """A store that does not answer: retries spent, or no byte for longer than the timeout. Never skipped."""


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


class Progress:
    """Bytes received by a download and when the last came: what a waiting reader's stall watchdog reads."""

    def __init__(self) -> None:
        self.received = 0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def add(self, count: int) -> None:
        with self.lock:
            self.received += count
            self.last = time.monotonic()

    def touch(self) -> None:
        """A new try started: the stall clock starts again."""
        with self.lock:
            self.last = time.monotonic()

    def idle(self) -> float:
        """Seconds since the last byte (or try)."""
        with self.lock:
            return time.monotonic() - self.last


def download(fs: Any, path: str, url: str, dest: Path, size: int, sha256: str, retry: Retry,
             progress: Progress | None = None, stopped: Callable[[], bool] = lambda: False) -> None:
    """Fetch object ``path`` (``url`` for messages) of ``size`` bytes into ``dest``, checked against ``sha256``.

    Raises:
        RemoteStoreError: tries spent on transient failures (named, with the last one), or an object that is
            longer than the manifest says.
        ChecksumMismatch: the bytes arrived whole but their SHA-256 is not ``sha256``.
        FileNotFoundError, PermissionError: as the store answered (not retried).
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
            if stopped():
                raise RemoteStoreError(f"download of {shown} was stopped")
            progress.touch()
            try:
                received = _read_from(fs, path, received, size, out, digest, progress)
                if received < size:
                    raise EOFError(f"the response ended after {received} of {size} bytes (truncated)")
            except Exception as err:  # noqa: BLE001 - sorted right below: transient ones are retried, others raised
                if not transient(err):
                    raise
                failures.append(scrubbed(err))
                if len(failures) >= retry.attempts:
                    raise RemoteStoreError(
                        f"{shown}: {len(failures)} tries failed (the last: {failures[-1]}); check that the store "
                        f"answers, or raise retries=/remote_timeout= for a slow one") from err
                time.sleep(retry.wait(len(failures)))
        out.flush()
        if digest.hexdigest() != sha256:
            raise ChecksumMismatch(f"{shown}: SHA-256 {digest.hexdigest()[:16]}... differs from the manifest's "
                                   f"{sha256[:16]}... (the object was altered or damaged in transit)")


def _read_from(fs: Any, path: str, offset: int, size: int, out: Any, digest: Any, progress: Progress) -> int:
    """Read ``path`` from ``offset`` on into ``out``; the offset reached (less than ``size`` if the reply ended).

    One ranged GET per piece (``cat_file``), and no request for the object's size: the manifest gives it, and
    asking (a HEAD before each download, as ``fs.open`` does) would double the round trips of a small shard. The
    last piece asks for one byte more, so an object longer than the manifest says is caught without another
    request.
    """
    while offset < size:
        wanted = min(_PIECE, size - offset)
        last = offset + wanted == size
        piece = fs.cat_file(path, start=offset, end=offset + wanted + (1 if last else 0))
        if len(piece) > wanted:
            raise RemoteStoreError(f"the object is longer than the manifest's {size} bytes (another dataset?)")
        out.write(piece)
        digest.update(piece)
        offset += len(piece)
        progress.add(len(piece))
        if len(piece) < wanted:  # the reply ended early: the caller retries from here
            break
    return offset


def retried(call: Callable[[], _T], what: str, retry: Retry) -> _T:
    """``call()``, tried again after a transient failure (:func:`transient`), at most ``retry.attempts`` tries.

    Raises:
        RemoteStoreError: tries spent on transient failures; names ``what`` (a redacted URL) and the last error.
        Any other error of ``call`` (a 403, a 404...), as it is.
    """
    for tries in range(1, retry.attempts + 1):
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - transient ones are retried, others raised as they are
            if not transient(err):
                raise
            if tries == retry.attempts:
                raise RemoteStoreError(f"{what}: {tries} tries failed (the last: {scrubbed(err)})") from err
            time.sleep(retry.wait(tries))
    raise AssertionError("unreachable")  # the loop returns or raises


def read_object(fs: Any, path: str, url: str, retry: Retry) -> bytes:
    """Object ``path`` (``url`` for messages) whole: for small ones (a manifest), with the retries of a download.

    Raises:
        FileNotFoundError: no such object (not retried).
        RemoteStoreError: tries spent.
    """
    return retried(lambda: bytes(fs.cat_file(path)), redact(url), retry)


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

    try:
        return retried(attempt, f"uploading {local.name} to {shown}", retry)
    except (FileNotFoundError, PermissionError) as err:
        raise type(err)(f"uploading {local.name} to {shown}: {err}") from err


def _is_file_system(fs: Any) -> bool:
    """Whether ``fs`` is the local file system (``file://``), where a file is visible while it is being written."""
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocol
