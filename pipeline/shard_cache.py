"""The remote cache: whole shards in a local folder, bounded in bytes, evicted least-recently-used.

Files are named by their SHA-256 (``<sha256>.arrow``), so a file in the cache is the shard the manifest names,
whatever URL it came from, and a second dataset or a restarted job reuses what is there (checked on first use).
Three sets decide what may be evicted::

    pinned     shards being read right now (a count per shard)        never evicted
    protected  shards the read-ahead wants next (within its budget)   evicted only after all others
    the rest   least recently used first                              evicted to make room

Several Loaders may share a folder (each keeps its own limit; a file another one removed is fetched again).
A shard being read is never evicted, so the folder may exceed ``limit`` by the shards being read at one moment
(``io_threads`` of them at most); a download for the read-ahead starts only when it fits without evicting a pinned
or protected shard. A shard whose checksum differs is downloaded once more. A download that failed (a second
mismatch, a 403 or 404, retries spent) is remembered with its error until :meth:`ShardCache.forget` (a reader's next
pass): every read of the shard raises that error again, and the read-ahead does not ask for it again, so a held
Loader never sends the store a request per read (or per look of the read-ahead) for a shard it cannot have.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from stallfree.core.home import cache_dir
from stallfree.ingest.fetch import Progress, exiting
from stallfree.ingest.manifest import file_sha256
from stallfree.ingest.remote import RemoteStoreError, Retry
from stallfree.ingest.transfer import ChecksumMismatch
from stallfree.pipeline.shards import ShardError

__all__ = ["ShardCache", "default_cache_dir"]

#: fetch(sha256, destination, progress): download one shard to ``destination``, checked against ``sha256``.
Fetch = Callable[[str, Path, Progress], None]


def default_cache_dir() -> Path:
    """``shards/`` in the stallfree cache, beside the verified markers and the ingest staging folders.

    That is :func:`stallfree.core.home.cache_dir`: ``$STALLFREE_CACHE_DIR``, else ``$XDG_CACHE_HOME/stallfree``,
    by default ``~/.cache/stallfree``.
    """
    return cache_dir() / "shards"


class ShardCache:
    """Shards on local disk, fetched on demand or ahead, at most ``downloads`` at once.

    One cache per folder in a process: Loaders that name the same ``cache_dir`` share it (:meth:`shared`), and a
    lock file keeps another process out (two processes evicting each other's files would fetch without end).

    Args:
        folder: the cache folder (created).
        limit: bytes the folder may hold (``None``: no limit).
        downloads: concurrent downloads.
        retry: the downloads' retry policy (its timeout also bounds how long :meth:`acquire` waits without a byte).

    Raises:
        ValueError: another process uses the folder (the message says to pass a ``cache_dir`` per process).
    """

    def __init__(self, folder: Path, limit: int | None, downloads: int, retry: Retry):
        self.folder, self.limit, self.retry = Path(folder), limit, retry
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lockfile = _lock_folder(self.folder)
        self._lock = threading.Condition()
        self._present: OrderedDict[str, int] = OrderedDict()  # sha256 -> bytes, least recently used first
        self._pending: dict[str, tuple[Future[None], Progress, int]] = {}
        self._bytes = 0  # of _present and _pending: asked at every read's release, so kept, not summed
        self._pins: Counter[str] = Counter()
        self._protected: dict[int, set[str]] = {}  # by read-ahead
        self._failed: dict[str, BaseException] = {}  # sha256 -> the error its download ended with
        self._unchecked: set[str] = set()  # found in the folder on start: hashed once before first use
        self._pool = ThreadPoolExecutor(downloads, thread_name_prefix="stallfree-download")
        self.downloads = downloads
        self.fetched = 0  # shards downloaded (for the benchmark and tests)
        self._evicted: list[weakref.WeakMethod[Callable[[str], None]]] = []
        self._done: list[weakref.WeakMethod[Callable[[], None]]] = []
        found = sorted(self.folder.glob("*.arrow"), key=lambda p: p.stat().st_mtime)
        for path in found:
            self._keep(path.stem, path.stat().st_size)
            self._unchecked.add(path.stem)

    @classmethod
    def shared(cls, folder: Path, limit: int | None, downloads: int, retry: Retry) -> ShardCache:
        """The process's cache of ``folder``, made on first use (a later Loader's limit must be the same).

        Raises:
            ValueError: the folder's cache has another ``cache_limit``.
        """
        key = Path(folder).expanduser().resolve()
        with _SHARED_LOCK:
            cache = _SHARED.get(key)
            if cache is None:
                cache = cls(key, limit, downloads, retry)
                _SHARED[key] = cache
            elif cache.limit != limit:
                raise ValueError(f"cache_dir={str(folder)!r} is the cache of another Loader with cache_limit="
                                 f"{cache.limit}, not {limit}; give the same limit, or another cache_dir")
            return cache

    def subscribe(self, on_evict: Callable[[str], None], on_done: Callable[[], None]) -> None:
        """Call ``on_evict(sha256)`` after each eviction and ``on_done()`` after each download (bound methods)."""
        with self._lock:
            self._evicted.append(weakref.WeakMethod(on_evict))
            self._done.append(weakref.WeakMethod(on_done))

    def close(self) -> None:
        """Cancel the downloads not started, and let the folder go (its lock): for a cache of one reader's own."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._lockfile.close()

    def path(self, sha256: str) -> Path:
        return self.folder / f"{sha256}.arrow"

    @property
    def used(self) -> int:
        """Bytes in the folder and being downloaded into it."""
        with self._lock:
            return self._bytes

    def _keep(self, sha256: str, size: int) -> None:
        self._drop(sha256)
        self._present[sha256] = size
        self._bytes += size

    def _drop(self, sha256: str) -> None:
        self._bytes -= self._present.pop(sha256, 0)

    def protect(self, owner: int, wanted: set[str]) -> None:
        """The shards read-ahead ``owner`` wants next: evicted only when nothing else can make room."""
        with self._lock:
            self._protected[owner] = set(wanted)

    def _is_protected(self, sha256: str) -> bool:
        return any(sha256 in wanted for wanted in self._protected.values())

    def pending(self) -> int:
        """Downloads in flight."""
        with self._lock:
            return len(self._pending)

    def has(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self._present or sha256 in self._pending

    def prefetch(self, sha256: str, size: int, fetch: Fetch, name: str) -> bool:
        """Start downloading a shard ahead if a download slot is free and it fits.

        Whether the read-ahead may go on to the next shard: this one is there, coming, or failed (not asked again).
        """
        with self._lock:
            if sha256 in self._present or sha256 in self._pending or sha256 in self._failed:
                return True
            if len(self._pending) >= self.downloads or not self._make_room(size, False):
                return False
            self._start(sha256, size, fetch, name)
            return True

    def acquire(self, sha256: str, size: int, fetch: Fetch, name: str) -> Path:
        """The shard's local file, downloading it if needed, pinned until :meth:`release`.

        Raises:
            ShardError: its checksum differed twice (names the shard and the URL).
            RemoteStoreError: the store did not answer (retries spent, or no byte for longer than the timeout), or
                refused or lacks the shard; the error its download ended with, until :meth:`forget`.
        """
        with self._lock:
            self._pins[sha256] += 1
        try:
            for _ in range(3):  # another Loader sharing the folder may remove a file between two looks
                self._wait(sha256, size, fetch, name)
                try:
                    if sha256 in self._unchecked:
                        self._check_found(sha256, size, fetch, name)
                    if self.path(sha256).is_file():
                        return self.path(sha256)
                except FileNotFoundError:
                    pass
                with self._lock:
                    self._drop(sha256)
                    self._unchecked.discard(sha256)
            raise ShardError(f"{name}: its file in {self.folder} keeps disappearing; "
                             "give each job its own cache_dir")
        except BaseException:
            self.release(sha256)
            raise

    def forget(self, shas: set[str]) -> None:
        """Forget the failures of these shards: a new pass asks the store for them again."""
        with self._lock:
            for sha256 in shas:
                self._failed.pop(sha256, None)

    def pin(self, sha256: str) -> bool:
        """Pin a shard that is here and checked, as :meth:`acquire` would; whether it was.

        ``False``: it is not here (or not checked yet), and :meth:`acquire` must fetch or check it. For a reader
        that holds the shard mapped already: a read then costs one lock, not a wait and a look at the file.
        Release it with :meth:`release`.
        """
        with self._lock:
            if sha256 not in self._present or sha256 in self._unchecked:
                return False
            self._pins[sha256] += 1
            self._present.move_to_end(sha256)
            return True

    def release(self, sha256: str) -> None:
        with self._lock:
            self._pins[sha256] -= 1
            if self._pins[sha256] <= 0:
                del self._pins[sha256]
            self._make_room(0, False)

    def _wait(self, sha256: str, size: int, fetch: Fetch, name: str) -> None:
        stall = self.retry.timeout + self.retry.max_backoff + 1.0  # the client's own timeout should fire first
        while True:
            with self._lock:
                if sha256 in self._failed:
                    raise _again(self._failed[sha256])
                if sha256 in self._present:
                    self._present.move_to_end(sha256)
                    return
                if sha256 not in self._pending:
                    self._make_room(size, True)
                    self._start(sha256, size, fetch, name)
                future, progress, _ = self._pending[sha256]
            try:
                future.result(timeout=0.2)
            except FutureTimeout:
                if exiting():
                    raise RemoteStoreError(f"{name}: the program is exiting") from None
                if progress.idle() > stall and future.running():
                    raise RemoteStoreError(f"{name}: no byte for {progress.idle():.0f} s "
                                           f"(remote_timeout={self.retry.timeout:g} s); the store is stalled or "
                                           "unreachable") from None
            # the outcome (present, failed, or another try) is read under the lock on the next turn

    def _start(self, sha256: str, size: int, fetch: Fetch, name: str) -> None:
        progress = Progress()
        future = self._pool.submit(self._download, sha256, progress, fetch, name)
        self._pending[sha256] = (future, progress, size)
        self._bytes += size

    def _download(self, sha256: str, progress: Progress, fetch: Fetch, name: str) -> None:
        dest = self.path(sha256)
        error: BaseException | None = None
        try:
            try:
                fetch(sha256, dest, progress)
            except ChecksumMismatch:  # once more: a damaged transfer is not a damaged object
                fetch(sha256, dest, progress)
        except ChecksumMismatch as err:
            error = ShardError(f"{name}: {err}, twice; re-upload the shard, or run "
                               "`stallfree verify` on the source dataset")
        except Exception as err:  # noqa: BLE001 - remembered, and raised to every waiter (_wait), none is lost
            error = err
        with self._lock:
            _, _, size = self._pending.pop(sha256)
            self._bytes -= size
            if error is None:
                self._keep(sha256, size)
                self.fetched += 1
            else:
                self._failed[sha256] = error
            self._lock.notify_all()
            done = [ref() for ref in self._done]
        for call in done:
            if call is not None:
                call()

    def _check_found(self, sha256: str, size: int, fetch: Fetch, name: str) -> None:
        """A file left by an earlier run: its hash once, and a fresh download if it differs."""
        path = self.path(sha256)
        if path.stat().st_size == size and file_sha256(path) == sha256:
            with self._lock:
                self._unchecked.discard(sha256)
            return
        with self._lock:
            self._unchecked.discard(sha256)
            self._drop(sha256)
        path.unlink(missing_ok=True)
        self._wait(sha256, size, fetch, name)

    def _make_room(self, size: int, demanded: bool) -> bool:
        """Evict until ``size`` more bytes fit; a demanded shard may also evict protected ones, and goes over."""
        if self.limit is None or self._bytes + size <= self.limit:  # every read's release asks: mostly it fits
            return True
        tiers = [[s for s in self._present if s not in self._pins and not self._is_protected(s)]]
        if demanded:
            tiers.append([s for s in self._present if s not in self._pins and self._is_protected(s)])
        for tier in tiers:
            for victim in tier:
                if self._bytes + size <= self.limit:
                    return True
                self._evict(victim)
        return self._bytes + size <= self.limit or demanded

    def _evict(self, sha256: str) -> None:
        self._drop(sha256)
        for ref in self._evicted:
            call = ref()
            if call is not None:
                call(sha256)
        self.path(sha256).unlink(missing_ok=True)  # mapped views of it stay valid until they are dropped (POSIX)


def _again(error: BaseException) -> BaseException:
    """A fresh copy of a remembered error for one more reader (one object raised by several threads tangles tracebacks).

    The store's errors (:class:`RemoteStoreError`, :class:`ShardError`) are made from their message; another type
    whose constructor wants more is raised as it is.
    """
    try:
        copy = type(error)(*error.args)
    except TypeError:
        return error
    copy.__cause__, copy.__suppress_context__ = error.__cause__, True
    return copy


_SHARED: weakref.WeakValueDictionary[Path, ShardCache] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def _lock_folder(folder: Path) -> Any:
    """Hold ``folder/.lock`` for this process, or a ValueError naming the fix if another process holds it."""
    import fcntl

    handle = open(folder / ".lock", "a+")  # noqa: SIM115 - held open for the cache's life: the lock is the handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ValueError(f"cache_dir {folder} is in use by another process; give each process (each rank) its own "
                         "cache_dir, e.g. cache_dir=f'/local/cache/rank{rank}'") from None
    return handle
