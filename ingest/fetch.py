"""One request to a store: streamed, its bytes counted as they arrive, cancellable, ended at program exit.

:func:`fetch` runs a GET (of a range, or of a whole object) on the client's event loop (fsspec's) while the calling
thread watches it. Bytes are counted into a :class:`Progress` as they arrive, and the watching thread gives the
request up by the two rules of its :class:`Pace` (the second is curl's ``--speed-limit``/``--speed-time``): no
byte for ``timeout`` seconds (a stall, whatever the client does: its socket timeout never fires while a
byte comes now and then), and, once bytes flow, fewer than ``min_rate`` bytes a second over the last ``window``
seconds (a trickle: a server sending a byte a second would otherwise hold the job as long as it likes). A steady
slow link (150 KB/s) is neither. The watching thread cancels the request, which closes its connection, on either,
on a deadline, when its caller stops, and when the program ends (:func:`exiting`): the interpreter joins the threads
of every ``concurrent.futures`` pool at exit, and a download it waited for could take hours.

A server that ignores Range answers a ranged GET with ``200`` and the whole object. Given a :class:`Sink` (a
download's file), the body is streamed into it as the whole object; without one it is :class:`Ignored`, raised
before the body is read.

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
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Ignored", "Pace", "Progress", "Sink", "Stopped", "TooLarge", "TooSlow", "Unexpected", "exiting", "fetch",
           "fetch_ranges", "pause", "protocols"]

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


@dataclass(frozen=True)
class Pace:
    """When a request is given up: the Loader's ``remote_timeout``, ``remote_min_rate`` and ``remote_rate_window``.

    Args:
        timeout: seconds without a byte (a store that stops sending, or takes that long to start).
        min_rate: bytes a second, averaged over ``window``, below which a request that has been receiving for
            ``window`` seconds is given up (a trickle); 0 turns the rule off.
        window: seconds over which the rate is averaged (curl's ``--speed-time``).
    """

    timeout: float = 60.0
    min_rate: float = 1024.0
    window: float = 30.0


class Sink(Protocol):
    """Where the body of a reply that is the whole object goes (a download's file): chunk by chunk, as it arrives."""

    def begin(self) -> None:
        """The whole object comes from its first byte: drop what an earlier request wrote."""

    def write(self, chunk: bytes) -> None:
        """The next bytes of the object (may raise to end the request: an object longer than expected)."""


class Stopped(Exception):
    """A request cancelled because the program is exiting; named by the caller."""


class Unexpected(Exception):
    """A reply that is not what was asked (a 200 to a ranged request, an object longer than listed); not retried.

    Raised inside a request, which does not know the URL to show: the caller names it (``remote._clean``).
    """


class Ignored(Unexpected):
    """A ranged request answered with the whole object (HTTP 200, or no Content-Range): the server ignores Range."""


class TooSlow(TimeoutError):
    """A request given up for receiving under :attr:`Pace.min_rate` over :attr:`Pace.window` (transient, retried)."""


class TooLarge(ValueError):
    """An object larger than the most a caller reads of it (a manifest); named by the caller (``remote._clean``)."""


def fetch(fs: Any, path: str, span: tuple[int, int] | None, progress: Progress, pace: Pace,
          limit: int | None = None, deadline: float | None = None, whole: Sink | None = None) -> bytes:
    """One request: bytes ``span`` (``start``, ``end``) of ``path``, or all of it, counted as they arrive.

    The request runs on the client's event loop (fsspec's) while this thread watches it: it is cancelled, and its
    connection closed, when no byte came for ``pace.timeout`` seconds (a ``TimeoutError``, transient), when it has
    received under ``pace.min_rate`` bytes a second over the last ``pace.window`` seconds (:class:`TooSlow`, a
    ``TimeoutError`` too), when it ran for ``deadline`` seconds, or when the interpreter is exiting
    (:class:`Stopped`). So a store that is slow but steady is never a stall, one that stops or trickles is one within
    those bounds whatever the client does, and neither keeps the process from ending. A client without an event
    loop (``file://``) is read directly.

    ``whole``: where the body goes when it is the whole object: a request with no ``span``, or a ranged one that
    the server answered with the whole object (it ignores Range). :meth:`Sink.begin` is called, then each chunk is
    written to it, and ``b""`` is returned.

    Raises:
        TooLarge: more than ``limit`` bytes came (the rest is not read).
        Ignored: a ranged request answered with the whole object, and no ``whole`` to take it.
        Unexpected: another reply that is not what was asked (an HTTP 4xx other than 401, 403, 404).
        FileNotFoundError, PermissionError, ConnectionError: HTTP 404, 401/403, 5xx/429; or the client's own errors.
    """
    progress.touch()
    loop = getattr(fs, "loop", None) if getattr(fs, "async_impl", False) else None
    if loop is None:
        data = bytes(fs.cat_file(path) if span is None else fs.cat_file(path, start=span[0], end=span[1]))
        if limit is not None and len(data) > limit:
            raise TooLarge(f"is larger than {limit} bytes")
        progress.add(len(data))
        if whole is not None and span is None:
            whole.begin()
            whole.write(data)
            return b""
        return data
    future = asyncio.run_coroutine_threadsafe(_stream(fs, path, span, progress, limit, whole), loop)
    return _watch(future, progress, pace, deadline)


def fetch_ranges(fs: Any, paths: list[str], starts: list[int], ends: list[int], pace: Pace,
                 concurrency: int) -> list[bytes | BaseException]:
    """Several ranged requests, ``concurrency`` in flight at once: each range's bytes, or the error that ended it.

    As :func:`fetch` for each, watched together: their bytes are counted into one :class:`Progress`, so the set
    fails :class:`Pace`'s rules only when all of it stalls or trickles; the requests unfinished then get that error,
    those finished keep their bytes. A server that ignores Range gives :class:`Ignored` before any of the body is
    read (a client that reads the body, as fsspec's ``cat_ranges`` does, would download the whole object for each
    range).

    Raises:
        Stopped: the interpreter is exiting.
    """
    progress = Progress()
    answers: list[bytes | BaseException | None] = [None] * len(paths)
    loop = getattr(fs, "loop", None) if getattr(fs, "async_impl", False) else None
    if loop is None:
        for i, (path, start, end) in enumerate(zip(paths, starts, ends, strict=True)):
            try:
                answers[i] = fetch(fs, path, (start, end), progress, pace)
            except Exception as err:  # noqa: BLE001 - each range's error is its answer, as cat_ranges gives it
                answers[i] = err
        return [a if a is not None else ConnectionError("not fetched") for a in answers]

    async def one(gate: asyncio.Semaphore, i: int) -> None:
        async with gate:
            try:
                answers[i] = await _stream(fs, paths[i], (starts[i], ends[i]), progress, None, None)
            except Exception as err:  # noqa: BLE001 - each range's error is its answer
                answers[i] = err

    async def every() -> bytes:
        gate = asyncio.Semaphore(max(1, concurrency))
        await asyncio.gather(*(one(gate, i) for i in range(len(paths))))
        return b""

    progress.touch()
    try:
        _watch(asyncio.run_coroutine_threadsafe(every(), loop), progress, pace, None)
    except TimeoutError as err:  # the set stalled or trickled: the ranges still out get its error
        return [a if a is not None else err for a in answers]
    return [a if a is not None else ConnectionError("not fetched") for a in answers]


def _watch(future: concurrent.futures.Future[bytes], progress: Progress, pace: Pace, deadline: float | None) -> bytes:
    """``future``'s result, watched every :data:`_POLL` seconds by :class:`Pace`'s rules and ``deadline``.

    The rate rule starts with the first byte (the time to it is ``pace.timeout``'s) and averages over the last
    ``pace.window`` seconds: the bytes counted then and now, sampled at each look.
    """
    began = time.monotonic()
    counted = progress.received
    first: float | None = None  # when the first byte of this request was seen
    looks: deque[tuple[float, int]] = deque()  # (when, bytes received), reaching back just past the window
    while True:
        done, _ = concurrent.futures.wait([future], timeout=_POLL)
        if done:
            return future.result()
        if exiting():
            future.cancel()
            raise Stopped("the request was cancelled: the program is exiting")
        if progress.idle() > pace.timeout:
            future.cancel()
            raise TimeoutError(f"no byte for {pace.timeout:g} s (remote_timeout)")
        now, received = time.monotonic(), progress.received
        if deadline is not None and now - began > deadline:
            future.cancel()
            raise Unexpected(f"did not arrive within {deadline:g} s (remote_timeout): the store is too slow; raise "
                              "remote_timeout= for a slow one")
        if first is None and received > counted:
            first = now
        looks.append((now, received))
        while len(looks) > 1 and looks[1][0] <= now - pace.window:
            looks.popleft()
        if first is not None and pace.min_rate > 0 and now - first >= pace.window:
            since, then = looks[0]
            if received - then < pace.min_rate * (now - since):
                future.cancel()
                raise TooSlow(f"{received - then} bytes in the last {now - since:.1f} s, under remote_min_rate="
                              f"{pace.min_rate:g} bytes/s averaged over remote_rate_window={pace.window:g} s: the "
                              "store sends too slowly (a trickle)")


async def _stream(fs: Any, path: str, span: tuple[int, int] | None, progress: Progress, limit: int | None,
                  whole: Sink | None) -> bytes:
    """The body of one GET on fsspec's loop, each chunk counted into ``progress`` as it arrives (see :func:`fetch`).

    HTTP and S3 are streamed (aiohttp's chunks, S3's body in 64 KiB reads); another store's client (gcsfs) is
    asked for the whole range (``_cat_file``), counted when it ends.
    """
    out = bytearray()
    sink: Sink | None = None  # where the chunks go once the reply is known to be the whole object

    def take(chunk: bytes) -> None:
        progress.add(len(chunk))
        if sink is not None:
            sink.write(chunk)
            return
        out.extend(chunk)
        if limit is not None and len(out) > limit:
            raise TooLarge(f"is larger than {limit} bytes")

    def whole_object(refusal: str) -> Sink | None:
        """The sink for a reply that is the whole object; a ranged request's with nowhere to go is ``Ignored``."""
        if whole is None and span is not None:
            raise Ignored(refusal)
        if whole is not None:
            whole.begin()
        return whole

    kinds = protocols(fs)
    ranged = {} if span is None else {"Range": f"bytes={span[0]}-{span[1] - 1}"}
    if "http" in kinds or "https" in kinds:
        options = dict(fs.kwargs)
        headers = {**(options.pop("headers", None) or {}), **ranged}
        session = await fs.set_session()
        async with session.get(fs.encode_url(path), headers=headers, **options) as reply:
            _check_status(reply.status, reply.reason)
            if span is None or reply.status != 206:
                sink = whole_object(f"the server ignored the ranged request (HTTP {reply.status}, not 206 Partial "
                                    "Content, to 'Range: bytes=...'); serve the data from a server that supports "
                                    "Range")
            async for chunk in reply.content.iter_any():
                take(chunk)
    elif "s3" in kinds:
        bucket, key, version = fs.split_path(path)
        reply = await fs._call_s3("get_object", Bucket=bucket, Key=key, **ranged,
                                  **({"VersionId": version} if version else {}))
        body = reply["Body"]
        try:
            if span is None or not reply.get("ContentRange"):
                sink = whole_object("the store ignored the ranged request (no Content-Range in its reply); serve "
                                    "the data from a store that supports Range")
            while chunk := await body.read(1 << 16):
                take(chunk)
        finally:
            body.close()
    else:
        if span is None:
            sink = whole_object("")
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
