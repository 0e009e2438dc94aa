"""Remote stores: the client for a URL, its one retry policy, its errors, and the small reads (an object, a range).

Both floors that meet a store use this module: the Loader reads shards through it (``stallfree.pipeline``), and
``stallfree ingest``/``verify``/``info`` write and check datasets at a URL (``stallfree.ingest``); it lives on the
lower floor so that there is one client, one retry policy and one :func:`redact`. Whole objects (a shard) move
through :mod:`~stallfree.ingest.transfer` (:func:`~stallfree.ingest.transfer.download`,
:func:`~stallfree.ingest.transfer.upload`), built on this.

The client is **fsspec** (``s3fs`` for ``s3://``, ``gcsfs`` for ``gs://``, its own ``aiohttp`` client for
``http(s)://``, the local file system for ``file://``). It was chosen over ``pyarrow.fs`` because pyarrow has no
HTTP file system (``https://`` is half of the issue), while fsspec gives one interface, one error translation
(missing object: ``FileNotFoundError``) and one ``storage_options`` dictionary for every scheme, as pandas,
Hugging Face datasets and MosaicML Streaming users already pass it.

A call to the store (:func:`retried`) is tried again after a transient failure (:func:`transient`: a dropped
connection, a client timeout, an HTTP 5xx or 429), after a backoff that doubles from ``retry.backoff`` up to
``retry.max_backoff``, at most ``retry.attempts`` tries in all; when they are spent, :class:`RemoteStoreError` names
the object and the last error. A 403 or 404 is not tried again. Small objects (a manifest) are read whole by
:func:`read_object`, a tar member by :func:`read_range`.

No exception of the client is kept in the chain (``__cause__``, ``__context__``) of the errors raised here: its
repr may hold the request's headers (``Authorization``) or a URL with a password. Only its type and its message,
URLs redacted, are carried over. URLs in messages go through :func:`redact`: credentials never appear in an error.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from stallfree.ingest.fetch import Ignored, Pace, Progress, Stopped, TooLarge, Unexpected, fetch, pause

__all__ = ["RangeIgnored", "RemoteStoreError", "Retry", "is_url", "list_objects", "open_store", "read_object",
           "read_range", "redact", "retried", "scrubbed", "store_error", "transient"]

#: The optional extra that brings each scheme's client.
_CLIENTS = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"), "http": ("aiohttp", "remote"),
            "https": ("aiohttp", "remote"), "file": ("fsspec", "remote")}
_T = TypeVar("_T")


class RemoteStoreError(RuntimeError):
    """A store that fails: retries spent, a stall, a refused or missing object, a reply that is not what was asked.

    Never skipped by ``on_error="skip"``; the message names the object's (redacted) URL.
    """


class RangeIgnored(RemoteStoreError):
    """A ranged read whose server ignores Range (it answered with the whole object): the caller may read it whole.

    Raised by :func:`read_range` before the body is read; a WebDataset reader then fetches the tar whole.
    """


@dataclass(frozen=True)
class Retry:
    """How downloads are retried.

    Args:
        attempts: tries per object (the first included), >= 1.
        backoff: seconds before the first retry; it doubles each time, up to ``max_backoff``.
        max_backoff: the longest wait between tries.
        timeout: seconds without a byte after which a try fails (and a waiting reader raises once tries are spent).
        min_rate: bytes a second, averaged over ``rate_window`` seconds once bytes flow, under which a try fails (a
            store trickling bytes); 0: no such rule.
        rate_window: the seconds ``min_rate`` is averaged over.

    ``min_rate`` and ``rate_window`` default to 1 KiB/s over 30 s. A link that slow cannot feed training (a
    256 MB shard would take three days), while any real one, a congested or mobile link included, is tens of KB/s
    or more: the rule ends a trickle and no link a job could use. 30 s (curl's ``--speed-time`` default) outlasts
    the pauses of a working connection (TCP's retransmission backoff, a store's throttling) and is half the default
    ``timeout``, so a trickle fails no later than a silence does.
    """

    attempts: int = 5
    backoff: float = 0.25
    max_backoff: float = 8.0
    timeout: float = 60.0
    min_rate: float = 1024.0
    rate_window: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise ValueError(f"retries must be an int >= 1 (tries per download), got {self.attempts!r}")
        for name in ("backoff", "max_backoff", "timeout", "rate_window"):
            value = getattr(self, name)
            if not _number(value) or not value > 0:
                name = _KEYWORDS.get(name, name)  # the Loader keyword it comes from
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not _number(self.min_rate) or not 0 <= self.min_rate < float("inf"):
            raise ValueError(f"remote_min_rate must be a number of bytes per second >= 0 (0: no minimum), got "
                             f"{self.min_rate!r}")

    @property
    def pace(self) -> Pace:
        """When one request is given up: no byte for ``timeout``, or under ``min_rate`` over ``rate_window``."""
        return Pace(self.timeout, self.min_rate, self.rate_window)

    def wait(self, failed: int) -> float:
        """Seconds to wait after the ``failed``-th failed try."""
        return float(min(self.max_backoff, self.backoff * 2 ** (failed - 1)))

    def deadline(self) -> float:
        """The longest a download may take to give up: every try stalling, and every wait between them."""
        return self.attempts * self.timeout + sum(self.wait(i) for i in range(1, self.attempts))


#: Retry's fields that a Loader keyword of another name sets, for messages.
_KEYWORDS = {"timeout": "remote_timeout", "rate_window": "remote_rate_window"}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    if isinstance(err, Ignored):
        return RangeIgnored(f"{what}: {err}")
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


def store_error(err: BaseException, what: str) -> BaseException:
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

    ``clean`` turns a failure that is not retried into the error raised (:func:`_clean`, or :func:`store_error`
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
    return retried(lambda: fetch(fs, path, None, Progress(), retry.pace, limit=limit, deadline=deadline), shown,
                   retry)


def read_range(fs: Any, path: str, url: str, start: int, end: int, retry: Retry) -> bytes:
    """Bytes ``start`` to ``end`` of object ``path`` (``url`` for messages): one ranged GET, retried.

    Raises:
        RangeIgnored: the server ignores Range (none of the whole object it sent was read).
        RemoteStoreError: tries spent, or a missing or refused object.
    """
    return retried(lambda: fetch(fs, path, (start, end), Progress(), retry.pace), redact(url), retry,
                   clean=store_error)


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


