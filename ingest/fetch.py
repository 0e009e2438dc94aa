"""One request to a store: streamed, its bytes counted as they arrive, cancellable, ended at program exit.

:func:`fetch` runs a GET (of a range, or of a whole object) on the client's event loop (fsspec's) while the calling
thread watches it. Bytes are counted into a :class:`Progress` as they arrive, so a store that trickles is slow, not
stalled, and one that stops sending is a stall within the timeout whatever the client does (its socket timeout may
never fire while a byte comes now and then). The watching thread cancels the request, which closes its connection,
on a stall, on a deadline, when its caller stops, and when the program ends (:func:`exiting`): the interpreter joins
the threads of every ``concurrent.futures`` pool at exit, and a download it waited for could take hours.

HTTP (aiohttp's chunks) and S3 (the body in 64 KiB reads) are streamed; another async client (gcsfs) is asked for
the range whole and counted when it ends; a client without an event loop (``file://``) is read directly.
:mod:`stallfree.ingest.remote` holds the retries and the errors' names; this module knows neither URL nor policy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread  # its exit hook (joining the pools' threads) must be registered before ours
import threading
import time
from typing import Any

__all__ = ["Progress", "Stopped", "TooLarge", "Unexpected", "exiting", "fetch", "pause", "protocols"]

#: How often a thread waiting for a request looks at the stall clock and at :func:`exiting`.
_POLL = 0.1
_EXITING = threading.Event()


def exiting() -> bool:
    """Whether the interpreter is exiting (or Ctrl-C ended the program): downloads and their waiters give up.

    Set by a hook that runs before ``concurrent.futures`` joins its pools' threads at exit, so that a download
    still running (a store trickling bytes) is cancelled rather than waited for.
    """
    return _EXITING.is_set()


# threading's own exit hooks run in reverse order of registration, before non-daemon threads are joined: this one,
# registered after concurrent.futures' (imported above), runs first
threading._register_atexit(_EXITING.set)  # type: ignore[attr-defined]  # the only pre-join hook


class Progress:
    """Bytes received by a download and when the last came (counted as they arrive): what stall watchdogs read."""

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


class Stopped(Exception):
    """A request cancelled because the program is exiting; named by the caller."""


class Unexpected(Exception):
    """A reply that is not what was asked (a 200 to a ranged request, an object longer than listed); not retried.

    Raised inside a request, which does not know the URL to show: the caller names it (``remote._clean``).
    """


class TooLarge(ValueError):
    """An object larger than the most a caller reads of it (a manifest); named by the caller (``remote._clean``)."""


def fetch(fs: Any, path: str, span: tuple[int, int] | None, progress: Progress, timeout: float,
          limit: int | None = None, deadline: float | None = None) -> bytes:
    """One request: bytes ``span`` (``start``, ``end``) of ``path``, or all of it, counted as they arrive.

    The request runs on the client's event loop (fsspec's) while this thread watches it: it is cancelled, and its
    connection closed, when no byte came for ``timeout`` seconds (a ``TimeoutError``, transient), when it ran for
    ``deadline`` seconds, or when the interpreter is exiting (:class:`Stopped`). So a
    store that trickles is never a stall, one that stops is one within ``timeout`` whatever the client does, and
    neither keeps the process from ending. A client without an event loop (``file://``) is read directly.

    Raises:
        TooLarge: more than ``limit`` bytes came (the rest is not read).
        Unexpected: a ranged request answered with the whole object.
        FileNotFoundError, PermissionError, ConnectionError: HTTP 404, 401/403, 5xx/429; or the client's own errors.
    """
    progress.touch()
    loop = getattr(fs, "loop", None) if getattr(fs, "async_impl", False) else None
    if loop is None:
        data = bytes(fs.cat_file(path) if span is None else fs.cat_file(path, start=span[0], end=span[1]))
        if limit is not None and len(data) > limit:
            raise TooLarge(f"is larger than {limit} bytes")
        progress.add(len(data))
        return data
    future = asyncio.run_coroutine_threadsafe(_stream(fs, path, span, progress, limit), loop)
    began = time.monotonic()
    while True:
        done, _ = concurrent.futures.wait([future], timeout=_POLL)
        if done:
            return future.result()
        if exiting():
            future.cancel()
            raise Stopped("the request was cancelled: the program is exiting")
        if progress.idle() > timeout:
            future.cancel()
            raise TimeoutError(f"no byte for {timeout:g} s (remote_timeout)")
        if deadline is not None and time.monotonic() - began > deadline:
            future.cancel()
            raise Unexpected(f"did not arrive within {deadline:g} s (remote_timeout): the store is too slow; raise "
                              "remote_timeout= for a slow one")


async def _stream(fs: Any, path: str, span: tuple[int, int] | None, progress: Progress, limit: int | None) -> bytes:
    """The body of one GET on fsspec's loop, each chunk counted into ``progress`` as it arrives (see :func:`fetch`).

    HTTP and S3 are streamed (aiohttp's chunks, S3's body in 64 KiB reads); another store's client (gcsfs) is
    asked for the whole range (``_cat_file``), counted when it ends.
    """
    out = bytearray()

    def take(chunk: bytes) -> None:
        out.extend(chunk)
        progress.add(len(chunk))
        if limit is not None and len(out) > limit:
            raise TooLarge(f"is larger than {limit} bytes")

    kinds = protocols(fs)
    ranged = {} if span is None else {"Range": f"bytes={span[0]}-{span[1] - 1}"}
    if "http" in kinds or "https" in kinds:
        options = dict(fs.kwargs)
        headers = {**(options.pop("headers", None) or {}), **ranged}
        session = await fs.set_session()
        async with session.get(fs.encode_url(path), headers=headers, **options) as reply:
            _check_status(reply.status, reply.reason)
            if span is not None and reply.status != 206:
                raise Unexpected(f"the server ignored the ranged request (HTTP {reply.status}, not 206 Partial "
                                  "Content, to 'Range: bytes=...'); serve the data from a server that supports Range")
            async for chunk in reply.content.iter_any():
                take(chunk)
    elif "s3" in kinds:
        bucket, key, version = fs.split_path(path)
        reply = await fs._call_s3("get_object", Bucket=bucket, Key=key, **ranged,
                                  **({"VersionId": version} if version else {}))
        body = reply["Body"]
        try:
            if span is not None and not reply.get("ContentRange"):
                raise Unexpected("the store ignored the ranged request (no Content-Range in its reply); serve the "
                                  "data from a store that supports Range")
            while chunk := await body.read(1 << 16):
                take(chunk)
        finally:
            body.close()
    else:
        take(bytes(await fs._cat_file(path, **({} if span is None else {"start": span[0], "end": span[1]}))))
    return bytes(out)


def _check_status(status: int, reason: str | None) -> None:
    """An HTTP error status as the error the rest of this module sorts (and fsspec raises for a 404)."""
    if status < 400:
        return
    what = f"HTTP {status} {reason or ''}".strip()
    if status in (404, 410):
        raise FileNotFoundError(what)
    if status in (401, 403):
        raise PermissionError(what)
    if status >= 500 or status == 429:
        raise ConnectionError(what)
    raise Unexpected(f"the store answered {what}")


def protocols(fs: Any) -> tuple[str, ...]:
    """The schemes an fsspec file system serves (``("http", "https")``, ``("s3", "s3a")``, ``("file", "local")``)."""
    protocol = fs.protocol
    return tuple(protocol) if isinstance(protocol, (tuple, list)) else (protocol,)


def pause(seconds: float) -> None:
    """Sleep ``seconds`` between tries, cut short by the interpreter exiting."""
    _EXITING.wait(seconds)
