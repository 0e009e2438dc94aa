"""Read-ahead that follows the sampler: the shards the coming rows need are downloaded before they are read.

The order of an epoch is known when it starts, so the epoch run hands this rank's rows, in stream order, to
:meth:`ReadAhead.follow`. A thread then keeps, from the reads' position on, the shards in the order they will
first be needed, up to ``budget`` bytes (always at least the next one), downloaded or downloading, at most the
cache's ``downloads`` at once, and marks them protected in the cache (evicted last). The position is the count of
reads since :meth:`follow`; reads run on several threads, so it is approximate, which only shifts what is fetched
a few rows early or late: a row whose shard is not there is fetched on demand.

The thread looks again when a download ends and when a read changes which shards are wanted, not after every
read: the wanted shards are the first ones of the coming rows, up to the first row of a shard that did not fit
(:attr:`ReadAhead._until`), and a read leaves that set as it was exactly when its shard is needed again before
that row (:attr:`ReadAhead._again`, the next row of the same shard, is computed once per :meth:`follow`). So the
protected set is always the one a look after every read would give, at a look per shard rather than per row.

With a global shuffle every shard is needed within a few rows, so a cache smaller than the dataset fetches shards
again and again; the block shuffle (``shuffle="block"``) keeps each stretch of the order inside a few shards.

A source read by range rather than by shard (WebDataset tars at a URL) has :class:`RangeReadAhead` instead: it
fetches the coming rows' byte ranges into memory, merged where they lie close together in one file.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from stallfree.ingest.fetch import exiting
from stallfree.pipeline.priority import lowered, run_at

if TYPE_CHECKING:
    from stallfree.pipeline.shard_cache import ShardCache

__all__ = ["RangeReadAhead", "ReadAhead"]


class ReadAhead:
    """Downloads the shards of the rows a rank reads next, within a byte budget (see the module docstring).

    A look costs the rows read since the last one, a pass over the shards and a sort of the few the budget can
    hold: the stream (:meth:`follow`) is indexed once, each row's next row of the same shard and each shard's
    first row, and a look moves the shards read since the last one to their next need. So a look does not depend
    on how many rows are still to come (an epoch of ImageNet is 1.28 million).
    """

    def __init__(self, cache: ShardCache, entries: list[dict[str, Any]], starts: np.ndarray, budget: int,
                 fetch: Any, names: list[str]):
        self.cache, self.entries, self.starts, self.budget = cache, entries, starts, budget
        self._fetch, self._names = fetch, names
        self._sizes = np.array([int(e["bytes"]) for e in entries], np.int64)
        # the most shards the budget can hold: a look sorts only that many (+1) of the coming ones
        self._most = max(1, budget // max(1, int(self._sizes.min()))) if len(entries) else 1
        self._shards = np.empty(0, np.int64)  # the shard of each coming row, in stream order
        self._again = np.empty(0, np.int64)  # per coming row: the next one of the same shard (len: none)
        self._need = np.empty(0, np.int64)  # per shard: its next row at or after _looked (len: none)
        self._looked = 0  # the position _need was brought up to
        self._stream = 0  # follow() count: a look of an older stream is dropped
        self._until = 0  # the first coming row whose shard the last look did not want (len: it wanted them all)
        self._position = 0
        self._wake = threading.Event()
        self._closed = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def follow(self, rows: np.ndarray) -> None:
        """Rows this rank reads next, in order (a new epoch or a resumed position replaces the old ones)."""
        shards = (np.searchsorted(self.starts, np.asarray(rows, np.int64), side="right") - 1).astype(np.int64)
        again, need = _index(shards, len(self.entries))
        with self._lock:
            self._shards, self._again, self._need = shards, again, need
            self._looked, self._until, self._position = 0, 0, 0
            self._stream += 1
            if self._thread is None:
                nice = lowered()
                self._thread = threading.Thread(target=_loop, args=(weakref.ref(self), self._wake, nice),
                                                name="stallfree-read-ahead", daemon=True)
                self._thread.start()
                run_at(nice, self._thread.native_id)
        self._wake.set()

    def wake(self) -> None:
        """Look again (a download ended)."""
        self._wake.set()

    def advance(self) -> None:
        """One row was read: the thread looks again if that changed the wanted shards (or it was the last row)."""
        with self._lock:
            read = self._position
            self._position += 1
            changed = read >= len(self._again) - 1 or self._again[read] >= self._until
        if changed:
            self._wake.set()

    def _look(self) -> tuple[list[int], int, int]:
        """The shards wanted, the stream they were computed for, and the first row (absolute) of a shard not wanted.

        The shards wanted are those needed from the position on, in order of first need, within the budget (at
        least one). Only the read-ahead's thread looks (and tests, with no thread running).
        """
        with self._lock:
            stream, position, looked = self._stream, self._position, self._looked
            shards, again, need = self._shards, self._again, self._need
        position = min(position, len(shards))
        if position > looked:  # each shard read since: its next need is its last read row's next row
            np.maximum.at(need, shards[looked:position], again[looked:position])
        with self._lock:
            if stream == self._stream:
                self._looked = max(self._looked, position)
        coming = np.flatnonzero(need < len(shards))
        if len(coming) > self._most + 1:  # the nearest needs only, not every shard of the dataset sorted
            coming = coming[np.argpartition(need[coming], self._most)[: self._most + 1]]
        order = coming[np.argsort(need[coming], kind="stable")]
        fits = int(np.searchsorted(np.cumsum(self._sizes[order]), self.budget, side="right"))
        chosen = order[: max(fits, 1)]
        until = int(need[order[len(chosen)]]) if len(chosen) < len(order) else len(shards)
        return chosen.tolist(), stream, until

    def _step(self) -> bool:
        """Start the downloads the coming rows need; ``False`` once closed or every coming row is read."""
        if self._closed:
            return False
        wanted, stream, until = self._look()
        with self._lock:
            if stream == self._stream:
                self._until = until
                # a read between the look and now that changed the set found the old _until: look once more
                if (self._again[self._looked : self._position] >= until).any():
                    self._wake.set()
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


def _index(shards: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Per position, the next position holding the same shard; per shard (of ``count``), its first position.

    ``len(shards)`` where there is none.
    """
    n = len(shards)
    again, first = np.full(n, n, np.int64), np.full(count, n, np.int64)
    order = np.argsort(shards, kind="stable")  # each shard's positions, in stream order, one after another
    same = shards[order[1:]] == shards[order[:-1]]
    again[order[:-1][same]] = order[1:][same]
    opens = np.concatenate([[True], ~same]) if n else np.empty(0, bool)
    first[shards[order[opens]]] = order[opens]
    return again, first


def _loop(ref: weakref.ref[ReadAhead] | weakref.ref[RangeReadAhead], wake: threading.Event, nice: int | None) -> None:
    """The read-ahead thread: it holds its ReadAhead (or RangeReadAhead) only while it works.

    Never while it waits, so a reader (and the Loader that held it) dropped without ``close()`` is collected, and
    the thread then ends. It runs, and its downloads' threads with it, at the lowered priority of the Loader's threads
    (priority.py).
    """
    run_at(nice)
    while True:
        wake.wait(timeout=0.5)
        wake.clear()
        ahead = ref()
        if ahead is None or not ahead._step():
            return
        del ahead


class RangeReadAhead:
    """Reads the byte ranges of the rows a rank reads next into memory, for sources read by range (tars).

    The coming rows (:meth:`follow`) are fetched in steps of a quarter of ``budget`` bytes and at most
    ``rows_per_step`` rows (so the first ones arrive soon). A step sorts its rows' ranges by file and offset and
    merges them where the gap between two is at most ``gap`` bytes (a merged range at most ``span`` bytes), so a
    stretch of rows in a few files (the block shuffle) costs a few large requests instead of one small one per
    row; the merged ranges are then fetched in the order their rows are read, ``ranges_per_fetch`` to a
    :meth:`fetch`, each call's rows handed over as soon as it returns (so with a global shuffle, one request per
    row, the next rows are not kept waiting for the whole step). Fetched bytes wait in memory, at most ``budget``
    of them, until :meth:`take` hands them to the read of their row; a read whose row is being fetched waits for
    it (up to ``wait`` seconds) rather than ask the store for the same bytes a second time. Anything that could
    not be fetched (a failure, a short answer) is simply not held: the row's read then goes to the store itself,
    which retries and raises as it always does, so the read-ahead changes when bytes arrive, never what is read.

    Args:
        locate: rows -> (file number, offset, size) arrays.
        fetch: (file numbers, starts, ends) -> each range's bytes, or the exception that ended it.
        budget: bytes held, fetched or being fetched, ahead of the reads.
        rows_per_step: rows fetched at most in one step.
        ranges_per_fetch: merged ranges in one :meth:`fetch` call (its requests run concurrently).
        wait: seconds a read waits for its row's fetch in flight before it reads the row itself.
    """

    gap = 64 << 10
    span = 8 << 20
    stale = 1024  # a held row this many reads behind the position was read from the store: dropped

    def __init__(self, locate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
                 fetch: Callable[[list[int], list[int], list[int]], list[Any]], budget: int, rows_per_step: int = 512,
                 ranges_per_fetch: int = 64, wait: float = 60.0):
        self._locate, self._fetch, self.budget, self.rows_per_step = locate, fetch, budget, rows_per_step
        self.ranges_per_fetch, self.wait = max(1, ranges_per_fetch), wait
        self._rows = np.empty(0, np.int64)  # the coming rows, in stream order
        self._position = 0  # rows read since follow()
        self._next = 0  # the first coming row not yet fetched
        self._held: dict[int, tuple[int, bytes]] = {}  # row -> (its stream index, its bytes)
        self._flight: set[int] = set()  # rows of the step being fetched, not yet handed over
        self._ready: tuple[Any, ...] | None = None  # the first window of follow(), for the thread to fetch
        self._bytes = 0
        self._generation = 0  # follow() drops what a fetch in flight for the old rows brings back
        self.hits = self.misses = 0  # reads served from memory, and from the store (for tests and benchmarks)
        self.fetches = 0  # fetch calls ended, each one request per merged range
        self._wake = threading.Event()
        self._closed = False
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # a fetch call ended: rows left the flight
        self._thread: threading.Thread | None = None

    def follow(self, rows: np.ndarray) -> None:
        """Rows this rank reads next, in order (a new epoch or a resumed position replaces the old ones)."""
        with self._lock:
            self._rows, self._position, self._next = np.asarray(rows, np.int64), 0, 0
            self._held, self._bytes, self._flight = {}, 0, set()
            self._generation += 1
            self._arrived.notify_all()
            if self._thread is None:
                nice = lowered()
                self._thread = threading.Thread(target=_loop, args=(weakref.ref(self), self._wake, nice),
                                                name="stallfree-range-read-ahead", daemon=True)
                self._thread.start()
                run_at(nice, self._thread.native_id)
        first = self._window()  # taken now, so the first reads find their rows in flight and wait for them
        with self._lock:
            self._ready = first
        self._wake.set()

    def take(self, row: int) -> bytes | None:
        """Row ``row``'s bytes if they were fetched ahead (handed over once), else ``None``; counts one read.

        A row being fetched is waited for, up to ``wait`` seconds, or until the program exits (the interpreter
        joins the reading threads at exit, and a fetch over a store that trickles could keep them a minute).
        """
        with self._lock:
            if row in self._flight:
                deadline = time.monotonic() + self.wait
                while row in self._flight and not self._closed and (left := deadline - time.monotonic()) > 0:
                    if exiting():
                        break
                    self._arrived.wait(min(left, 0.1))
            held = self._held.pop(row, None)
            self._position += 1
            if held is None:
                self.misses += 1
            else:
                self.hits += 1
                self._bytes -= len(held[1])
        self._wake.set()
        return None if held is None else held[1]

    def _window(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None:
        """The next rows to fetch, their stream indexes and ranges, within a quarter of the budget; None: none now."""
        with self._lock:
            for row, (index, data) in list(self._held.items()):
                if index < self._position - self.stale:
                    del self._held[row]
                    self._bytes -= len(data)
            self._next = max(self._next, self._position)
            room = min(self.budget - self._bytes, max(self.budget // 4, 1))
            if self._next >= len(self._rows) or room <= 0:
                return None
            first, generation = self._next, self._generation
            rows = self._rows[first : first + self.rows_per_step]
        files, offsets, sizes = self._locate(rows)
        count = max(1, int(np.searchsorted(np.cumsum(sizes), room, side="right")))
        with self._lock:
            if generation != self._generation:
                return None
            self._next = first + count
            self._flight.update(rows[:count].tolist())
        return rows[:count], np.arange(first, first + count), files[:count], offsets[:count], sizes[:count], generation

    def _step(self) -> bool:
        """Fetch the next window of rows; ``False`` once closed or every coming row is fetched or read."""
        if self._closed:
            return False
        with self._lock:
            window, self._ready = self._ready, None
        if window is None or window[-1] != self._generation:
            window = self._window()
        if window is None:
            with self._lock:
                if self._next >= len(self._rows) and not self._held and self._ready is None:
                    self._thread = None
                    return False
            return True
        rows, indexes, files, offsets, sizes, generation = window
        order = np.lexsort((offsets, files))
        ranges: list[tuple[int, int, int, list[int]]] = []  # file, start, end, members (positions in rows)
        for i in order.tolist():
            file, start, end = int(files[i]), int(offsets[i]), int(offsets[i] + sizes[i])
            if ranges and ranges[-1][0] == file and start - ranges[-1][2] <= self.gap \
                    and end - ranges[-1][1] <= self.span:
                last = ranges[-1]
                ranges[-1] = (file, last[1], max(last[2], end), [*last[3], i])
            else:
                ranges.append((file, start, end, [i]))
        ranges.sort(key=lambda r: int(indexes[r[3][0]]))  # fetched in the order their first rows are read
        try:
            for begin in range(0, len(ranges), self.ranges_per_fetch):
                if not self._hand_over(ranges[begin : begin + self.ranges_per_fetch], rows, indexes, offsets, sizes,
                                       generation):
                    break
        finally:
            with self._lock:  # a step that ended early keeps no read waiting for it
                if generation == self._generation:
                    self._flight.difference_update(rows.tolist())
                self._arrived.notify_all()
        return not self._closed

    def _hand_over(self, ranges: list[tuple[int, int, int, list[int]]], rows: np.ndarray, indexes: np.ndarray,
                   offsets: np.ndarray, sizes: np.ndarray, generation: int) -> bool:
        """Fetch ``ranges`` and hold their rows' bytes; ``False`` if the rows were replaced or the reader closed."""
        try:
            answers = self._fetch([r[0] for r in ranges], [r[1] for r in ranges], [r[2] for r in ranges])
        except OSError:
            answers = [None] * len(ranges)  # the rows' own reads go to the store, which retries and names it
        with self._lock:
            self.fetches += 1
            if generation != self._generation or self._closed:
                return False
            for (_, start, end, members), data in zip(ranges, answers, strict=True):
                whole = isinstance(data, (bytes, bytearray)) and len(data) == end - start
                for i in members:
                    self._flight.discard(int(rows[i]))
                    begin = int(offsets[i]) - start
                    if whole and int(indexes[i]) >= self._position - self.stale:
                        piece = bytes(data[begin : begin + int(sizes[i])])
                        self._held[int(rows[i])] = (int(indexes[i]), piece)
                        self._bytes += len(piece)
            self._arrived.notify_all()
        return True

    def close(self, wait: float = 10.0) -> None:
        """Stop: drop what is held, and wait up to ``wait`` seconds for a fetch in flight to end."""
        self._closed = True
        with self._lock:
            self._held, self._bytes, self._flight = {}, 0, set()
            self._arrived.notify_all()
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait)
