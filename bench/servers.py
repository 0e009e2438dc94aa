"""Real HTTP servers on 127.0.0.1 for the remote benchmark and the tests: file servers, with Range or not; a proxy.

- :class:`RangeServer` serves a folder over HTTP/1.1 with ``Range: bytes=a-b`` (206 replies), ``HEAD`` and
  keep-alive, as a static file server or a CDN does.
- :class:`PlainServer` serves a folder with the standard library's handler, the one ``python -m http.server`` runs:
  it ignores Range (a ``200`` with the whole file) and closes each connection (HTTP/1.0).
- :class:`FaultProxy` forwards HTTP requests to it, or to an object store of :mod:`stallfree.bench.stores`
  (S3, Cloud Storage), and, on command, adds latency, caps bandwidth, answers
  503, 500, 403 or 404, drops the connection, truncates the body, flips a byte, stalls, trickles the body at a few
  bytes a second, ignores the Range header (a 200 with the whole object, as a server without Range support does),
  or sends an endless body; faults are counted per request, so a test says "the next 2 requests for ``.arrow``
  files fail" (GETs, or uploads: ``method="PUT"``) and knows what the client met; :attr:`FaultProxy.seen` lists
  every request forwarded.

Everything listens on 127.0.0.1 only, on a port the system picks.
"""

from __future__ import annotations

import functools
import http.client
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

__all__ = ["CONTROL", "FaultProxy", "PlainServer", "RangeServer", "serve"]

CONTROL = "/__proxy__/latency/"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a client opening 64 connections at once (a read-ahead's
    # concurrent ranged reads) had most of its SYNs dropped and retried after 1, 3, 7 ... s. nginx listens with 511.
    request_queue_size = 511
    closed = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a handler still running when its server (or upstream) closed, or a client that closed its end (a request
        # given up), is no news
        if not self.closed and not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Background:
    """A server run on a thread; ``url`` is where it listens."""

    def __init__(self, handler: Callable[..., BaseHTTPRequestHandler]):
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests = 0
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.closed = True
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as real servers set it: without it a kept-alive connection's small replies wait on Nagle and the
    # client's delayed ACK (about 40 ms each), which a store on the same host would never cost.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: a test's output is its assertions."""

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        owner: RangeServer = self.server.owner  # type: ignore[attr-defined]
        owner.requests += 1
        path = (owner.root / self.path.split("?", 1)[0].lstrip("/")).resolve()
        if owner.root.resolve() not in path.parents or not path.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = path.stat().st_size
        start, end = 0, size - 1
        wanted = self.headers.get("Range")
        match = _RANGE.match(wanted.strip()) if wanted else None
        if wanted and (match is None or (not match[1] and not match[2])):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if match is not None:
            if match[1]:
                start, end = int(match[1]), min(int(match[2]) if match[2] else size - 1, size - 1)
            else:  # a suffix: the last N bytes
                start = max(0, size - int(match[2]))
        if start > end and size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if match is not None else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(max(0, end - start + 1)))
        self.send_header("ETag", f'"{path.stat().st_mtime_ns:x}-{size:x}"')  # as nginx does: a changed file, a new tag
        if match is not None:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if body and size:
            self.wfile.flush()
            with open(path, "rb") as f:  # zero-copy, as a static file server sends a file
                self.connection.sendfile(f, start, end - start + 1)


class RangeServer(_Background):
    """``root`` over HTTP on 127.0.0.1 with Range support (``url`` is its address); a context manager."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        super().__init__(_RangeHandler)


class _PlainHandler(SimpleHTTPRequestHandler):
    """``python -m http.server``'s handler as it is, quiet, noting each request (what a test asserts on)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: a test's output is its assertions."""

    def send_head(self) -> Any:
        owner: PlainServer = self.server.owner  # type: ignore[attr-defined]
        with owner.lock:
            owner.seen.append((self.command, self.path, self.headers.get("Range")))
        return super().send_head()


class PlainServer(_Background):
    """``root`` over HTTP on 127.0.0.1 as ``python -m http.server`` serves it: no Range; a context manager.

    :attr:`seen` lists every request as ``(method, path, its Range header or None)``.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.seen: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        super().__init__(functools.partial(_PlainHandler, directory=str(self.root)))


#: What :meth:`FaultProxy.inject` knows; the status answers carry no body.
_KINDS = ("503", "500", "403", "404", "drop", "truncate", "corrupt", "stall", "trickle", "ignore-range", "endless")


@dataclass
class _Fault:
    kind: str
    count: int
    match: str
    seconds: float = 0.0
    method: str = "GET"
    rate: float = 0.0  # bytes per second of a "trickle"


@dataclass
class _Faults:
    latency: float = 0.0  # seconds before each reply
    bandwidth: float | None = None  # bytes per second of every reply's body
    queue: list[_Fault] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    met: list[str] = field(default_factory=list)  # "kind path" of every fault applied, in order
    seen: list[str] = field(default_factory=list)  # "METHOD path" of every request, in order

    def take(self, method: str, path: str) -> _Fault | None:
        with self.lock:
            self.seen.append(f"{method} {path}")
            for fault in self.queue:
                if fault.method == method and fault.match in path and fault.count > 0:
                    fault.count -= 1
                    self.met.append(f"{fault.kind} {path}")
                    return fault
        return None


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as _RangeHandler's
    _connection: http.client.HTTPConnection | None = None  # upstream, per client connection (a handler)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Quiet: a test's output is its assertions."""

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def _forward(self) -> None:
        owner: FaultProxy = self.server.owner  # type: ignore[attr-defined]
        if self.path.startswith(CONTROL):  # /__proxy__/latency/<ms>: a benchmark in another process sets it
            owner.faults.latency = float(self.path.rsplit("/", 1)[1]) / 1e3
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        owner.requests += 1
        length = int(self.headers.get("Content-Length") or 0)
        sent = self.rfile.read(length) if length else None
        fault = owner.faults.take(self.command, self.path)
        if fault is not None and fault.kind == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault is not None and fault.kind == "stall":
            time.sleep(fault.seconds)
            if self.server.closed:  # type: ignore[attr-defined]
                return
        if fault is not None and fault.kind in ("503", "500", "403", "404"):
            self.send_response(int(fault.kind))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if fault is not None and fault.kind == "endless":  # a 200 whose body never ends (no length: until close)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            self.close_connection = True
            try:
                while not self.server.closed:  # type: ignore[attr-defined]
                    self.wfile.write(b"[" * (1 << 16))
            except ConnectionError:  # the client gave up: that is what it should do
                pass
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if fault is not None and fault.kind == "ignore-range":
            headers = {k: v for k, v in headers.items() if k.lower() != "range"}
        reply, data = self._upstream(owner.upstream_port, sent, headers)
        if owner.faults.latency:
            time.sleep(owner.faults.latency)
        self.send_response(reply.status)
        for key, value in reply.getheaders():
            if key.lower() not in _HOP and key.lower() != "content-length":
                self.send_header(key, value)
        # a HEAD reply has no body but the length of the GET's
        self.send_header("Content-Length", reply.getheader("Content-Length", "0") if self.command == "HEAD"
                         else str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault is not None and fault.kind == "corrupt" and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        if fault is not None and fault.kind == "truncate":
            self._send(data[: len(data) // 2], owner.faults.bandwidth)
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(data, fault.rate if fault is not None and fault.kind == "trickle" else owner.faults.bandwidth)

    def _upstream(self, port: int, sent: bytes | None, headers: dict[str, str]) -> tuple[Any, bytes]:
        """The upstream's reply and body, over this client connection's own kept-alive upstream connection.

        One upstream connection per client connection (a new one per request cost the upstream server a TCP
        handshake and a thread each); a kept-alive connection the upstream closed meanwhile is opened again once.
        """
        for attempt in (0, 1):
            if self._connection is None:
                self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                self._connection.request(self.command, self.path, body=sent, headers=headers)
                reply = self._connection.getresponse()
                data = reply.read()
            except (http.client.RemoteDisconnected, ConnectionError):
                self._connection.close()
                self._connection = None
                if attempt:
                    raise
                continue
            if reply.will_close:
                self._connection.close()
                self._connection = None
            return reply, data
        raise AssertionError("unreachable")

    def finish(self) -> None:
        if self._connection is not None:
            self._connection.close()
        super().finish()

    def _send(self, data: bytes, bandwidth: float | None) -> None:
        # a quarter MB a write (2.6 ms at 100 MB/s), or under a cap 20 writes a second: a steady stream, as a slow
        # link gives, not a burst and a long silence
        piece = max(1, min(1 << 18, int(bandwidth / 20))) if bandwidth else 1 << 18
        view = memoryview(data)
        for start in range(0, len(data), piece):
            if self.server.closed:  # type: ignore[attr-defined]
                return
            chunk = view[start : start + piece]
            try:
                self.wfile.write(chunk)
            except ConnectionError:  # the client cancelled a slow reply: no news
                self.close_connection = True
                return
            if bandwidth:
                time.sleep(len(chunk) / bandwidth)


class FaultProxy(_Background):
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` (a URL on 127.0.0.1) that injects faults on command.

    ``latency`` and ``bandwidth`` (bytes/s) apply to every reply; :meth:`inject` queues faults for the next
    ``count`` requests of ``method`` (GET unless told) whose path contains ``match``: ``"503"``, ``"500"``,
    ``"403"``, ``"404"`` (that status, no body), ``"drop"`` (the connection closes with no reply), ``"truncate"``
    (half the body, then close), ``"corrupt"`` (the first byte flipped), ``"stall"`` (``seconds`` before the
    reply), ``"trickle"`` (the body at ``rate`` bytes/s), ``"ignore-range"`` (the request forwarded without its
    Range header: a 200 with the whole object), ``"endless"`` (a 200 whose body never ends). :attr:`met` lists the
    faults applied, :attr:`seen` every request (``"PUT /bucket/key"``).
    """

    def __init__(self, upstream: str, latency: float = 0.0, bandwidth: float | None = None):
        self.upstream_port = int(upstream.rsplit(":", 1)[1].split("/", 1)[0])
        self.faults = _Faults(latency=latency, bandwidth=bandwidth)
        super().__init__(_ProxyHandler)

    def inject(self, kind: str, count: int = 1, match: str = "", seconds: float = 0.0, method: str = "GET",
               rate: float = 0.0) -> None:
        if kind not in _KINDS:
            raise ValueError(f"unknown fault {kind!r}; one of {_KINDS}")
        if kind == "trickle" and rate <= 0:
            raise ValueError(f"a trickle needs rate= (bytes per second) > 0, got {rate!r}")
        with self.faults.lock:
            self.faults.queue.append(_Fault(kind, count, match, seconds, method, rate))

    @property
    def met(self) -> list[str]:
        with self.faults.lock:
            return list(self.faults.met)

    @property
    def seen(self) -> list[str]:
        with self.faults.lock:
            return list(self.faults.seen)


def serve(folder: str, bandwidth: float | None, out: TextIO) -> None:
    """Serve ``folder`` over HTTP and S3 behind a proxy each; write their URLs as JSON to ``out``; stop at EOF on stdin.

    The benchmark runs the servers in a process of their own (``python -m stallfree.bench.servers``), so that they
    take no interpreter time (the GIL) from the Loader being measured.
    """
    import json
    import sys

    from stallfree.bench.stores import s3_server

    with RangeServer(folder) as http, s3_server(folder, bucket="bench", prefix="ds") as endpoint, \
            FaultProxy(http.url, bandwidth=bandwidth) as http_proxy, \
            FaultProxy(endpoint, bandwidth=bandwidth) as s3_proxy:
        print(json.dumps({"http": http_proxy.url, "s3": s3_proxy.url}), file=out, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    import sys

    serve(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else None, sys.stdout)  # a pipe to the benchmark
