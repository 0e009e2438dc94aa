"""Read-ahead that follows the sampler: the shards the coming rows need are downloaded before they are read.

The order of an epoch is known when it starts, so the epoch run hands this rank's rows, in stream order, to
:meth:`ReadAhead.follow`. A thread then keeps, from the reads' position on, the shards in the order they will
first be needed, up to ``budget`` bytes (always at least the next one), downloaded or downloading, at most the
cache's ``downloads`` at once, and marks them protected in the cache (evicted last). The position is the count of
reads since :meth:`follow`; reads run on several threads, so it is approximate, which only shifts what is fetched
a few rows early or late: a row whose shard is not there is fetched on demand.

With a global shuffle every shard is needed within a few rows, so a cache smaller than the dataset fetches shards
again and again; the block shuffle (``shuffle="block"``) keeps each stretch of the order inside a few shards.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from stallfree.pipeline.shard_cache import ShardCache

__all__ = ["ReadAhead"]


class ReadAhead:
    """Downloads the shards of the rows a rank reads next, within a byte budget (see the module docstring)."""

    def __init__(self, cache: ShardCache, entries: list[dict[str, Any]], starts: np.ndarray, budget: int,
                 fetch: Any, names: list[str]):
        self.cache, self.entries, self.starts, self.budget = cache, entries, starts, budget
        self._fetch, self._names = fetch, names
        self._shards = np.empty(0, np.int64)  # the shard of each coming row, in stream order
        self._position = 0
        self._wake = threading.Event()
        self._closed = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def follow(self, rows: np.ndarray) -> None:
        """Rows this rank reads next, in order (a new epoch or a resumed position replaces the old ones)."""
        shards = np.searchsorted(self.starts, np.asarray(rows, np.int64), side="right") - 1
        with self._lock:
            self._shards, self._position = shards.astype(np.int64), 0
            if self._thread is None:
                self._thread = threading.Thread(target=_loop, args=(weakref.ref(self), self._wake),
                                                name="stallfree-read-ahead", daemon=True)
                self._thread.start()
        self._wake.set()

    def wake(self) -> None:
        """Look again (a download ended)."""
        self._wake.set()

    def advance(self) -> None:
        """One row was read."""
        with self._lock:
            self._position += 1
        self._wake.set()

    def wanted(self) -> list[int]:
        """The shards needed from the position on, in order of first need, within the budget (at least one)."""
        with self._lock:
            coming = self._shards[self._position :]
        chosen: list[int] = []
        total, span = 0, 256
        while True:
            window = coming[:span]
            first = np.unique(window, return_index=True)
            order = first[0][np.argsort(first[1])].tolist()
            for shard in order[len(chosen) :]:
                size = int(self.entries[shard]["bytes"])
                if chosen and total + size > self.budget:
                    return chosen
                chosen.append(int(shard))
                total += size
            if span >= len(coming):
                return chosen
            span *= 4

    def _step(self) -> bool:
        """Start the downloads the coming rows need; ``False`` once closed or every coming row is read."""
        if self._closed:
            return False
        wanted = self.wanted()
        if not wanted:  # every coming row read: the next follow() starts a new thread
            with self._lock:
                if self._position >= len(self._shards):
                    self._thread = None
                    return False
        self.cache.protect(id(self), {self.entries[s]["sha256"] for s in wanted})
        for shard in wanted:
            entry = self.entries[shard]
            try:
                started = self.cache.prefetch(entry["sha256"], int(entry["bytes"]), self._fetch, self._names[shard])
            except RuntimeError:  # the interpreter is exiting: its executors take no more work
                return False
            if not started:
                break  # no slot or no room: wait for a read or a download to end
        return True

    def close(self) -> None:
        self._closed = True
        self.cache.protect(id(self), set())
        self._wake.set()


def _loop(ref: weakref.ref[ReadAhead], wake: threading.Event) -> None:
    """The read-ahead thread: it holds its ReadAhead only while it works.

    Never while it waits, so a reader (and the Loader that held it) dropped without ``close()`` is collected, and
    the thread then ends.
    """
    while True:
        wake.wait(timeout=0.5)
        wake.clear()
        ahead = ref()
        if ahead is None or not ahead._step():
            return
        del ahead
