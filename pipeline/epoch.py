"""One pass over an epoch: the reader and graph threads, the queues between them, and the skip policy.

The rank's stream is its epoch order, wrapping round: position ``p`` is sample ``order[p % len(order)]``. The
reader stage (:mod:`.read_stage`) reads the stream ahead; the graph stage (:mod:`.graph_stage`) takes from it,
in order, the samples of each batch, and replaces every sample that fails (on the host or in the graph) by the
next ones, so each batch is full and the epoch has ``len(loader)`` batches whatever is skipped. A position keeps
its outcome for the epoch: a skipped sample met again after the wrap is passed over without being read or listed
again.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from stallfree.pipeline.graph_stage import GraphStage
from stallfree.pipeline.priority import lowered, run_at
from stallfree.pipeline.read_stage import ReadStage
from stallfree.pipeline.samples import Batch
from stallfree.pipeline.skips import SkipPolicy

if TYPE_CHECKING:
    from stallfree.pipeline.graph import Graph
    from stallfree.pipeline.run import Clock
    from stallfree.pipeline.run_config import RunParts

__all__ = ["EpochRun"]


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_DONE = object()  # what a stage puts on its queue when it has nothing more
_RUNNING: weakref.WeakSet[EpochRun] = weakref.WeakSet()


@atexit.register  # registered after DALI's own hook (graph imports DALI first), so it runs before it
def _stop_running_epochs() -> None:
    """Let no graph run while the interpreter shuts DALI down (that aborts the process)."""
    runs = list(_RUNNING)
    for run in runs:
        run.stop()
    for run in runs:
        run.join(timeout=10.0)


class EpochRun:
    """One pass over ``epoch`` split from ``split`` on, from ``position`` (batch ``number``): both stage threads.

    Built from the run's parts (:class:`~stallfree.pipeline.run_config.RunParts`) and the graph, never from the
    Loader: the pass's iterator holds the Loader, the threads do not, so a Loader dropped after a pass
    (``list(Loader(...))``) is freed at once and its run started ahead is stopped with it.
    """

    def __init__(self, parts: RunParts, graph: Graph, epoch: int, split: int, position: int, number: int,
                 skipped: list[dict[str, Any]], *, idle_s: float | None = None):
        self.parts, self.config, self.graph, self.epoch = parts, parts.config, graph, epoch
        # The run holds its clock spans until a pass takes it and gives it that pass's clock (attach): a run started
        # ahead must not show the next epoch's batch numbers in a profile of this one, and a discarded run never
        # reports its work. Untaken after ``idle_s`` it stops by itself, checked by its own threads as they wait: no
        # timer thread may hold the run, since a thread that drops a run's last batch while the interpreter shuts
        # down aborts it.
        self._clock: Clock | None = None
        self._held: list[tuple[str, str, float, float, int]] | None = []
        self._idle_until = None if idle_s is None else time.monotonic() + idle_s
        self._span_lock = threading.Lock()
        self.start = (split, position, number)
        self.order = parts.sampler.virtual_order(epoch, split)
        self.skips = SkipPolicy(parts.config.on_error, parts.reader, epoch, len(self.order), skipped)
        self._stop = threading.Event()
        # Set once the read stage has queued its plan's last chunk: the next epoch's run may start then, its reads
        # overlapping this run's last batches in the graph (the graph's lock keeps the two runs' batches apart).
        self.may_start_next = threading.Event()
        self.read_q: queue.Queue[Any] = queue.Queue(parts.config.prefetch)
        self.out_q: queue.Queue[Any] = queue.Queue(parts.config.prefetch)
        self.more: queue.Queue[int] = queue.Queue()  # samples the graph stage rejected, for the reader to replace
        # A remote reader's read-ahead takes the coming rows.
        parts.reader.follow(parts.sampler.rows(self.order[position % len(self.order) :]))
        reader, assembler = ReadStage(self), GraphStage(self, position)
        self._nice = lowered()
        self._threads = [
            threading.Thread(target=self._guard, args=(reader.loop, self.read_q, position, number), daemon=True),
            threading.Thread(target=self._guard, args=(assembler.loop, self.out_q, number), daemon=True),
        ]
        for thread in self._threads:
            thread.start()
            run_at(self._nice, thread.native_id)
        _RUNNING.add(self)

    def stop(self) -> None:
        """Stop both threads; a partly consumed epoch can be abandoned at any time."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        """Whether the run is stopped (by :meth:`stop`, or started ahead and left untaken past its idle time)."""
        until = self._idle_until
        if until is not None and time.monotonic() > until:
            self._stop.set()
        return self._stop.is_set()

    def join(self, timeout: float) -> None:
        """Wait for both threads to end (after :meth:`stop`); called on one of them, wait for the other only."""
        for thread in self._threads:
            if thread is not threading.current_thread():  # a finalizer may run on one of them
                thread.join(timeout)

    def put(self, q: queue.Queue[Any], item: Any) -> bool:
        """Put ``item`` on ``q``, waiting for room; ``False`` once the run is stopped."""
        while not self.stopped:
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get(self, q: queue.Queue[Any]) -> Any:
        """The next item of ``q``; ``None`` once its stage is done or the run stopped; a stage's failure is raised."""
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                if self.stopped:
                    return None
                continue
            if isinstance(item, _Failure):
                raise item.error
            return None if item is _DONE else item

    def _guard(self, loop: Any, out: queue.Queue[Any], *args: Any) -> None:
        try:
            run_at(self._nice)  # the training loop gets a core when it wants one (priority.py); the reads inherit it
            loop(*args)
        except BaseException as err:  # noqa: BLE001 - every failure reaches the training loop, none is lost
            self.put(out, _Failure(err))
            return
        self.put(out, _DONE)

    def record(self, stage: str, state: str, start: float, batch: int) -> None:
        """Report a span from ``start`` to now to the pass's clock (held until a pass takes the run)."""
        if self._held is None and self._clock is None:
            return
        span = (stage, state, start, time.perf_counter(), batch)
        with self._span_lock:
            if self._held is not None:
                self._held.append(span)
                return
        if self._clock is not None:
            self._clock.record(*span)

    def ready(self) -> bool:
        return self.out_q.qsize() > 0

    def taken(self) -> None:
        """The run started ahead is taken: it no longer stops when idle."""
        self._idle_until = None

    def attach(self, clock: Clock | None) -> None:
        with self._span_lock:
            held, self._held, self._clock = self._held or [], None, clock
        if clock is not None:
            for span in held:
                clock.record(*span)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            start_time = time.perf_counter()
            item = self.get(self.out_q)
            if item is None:
                return
            if self._clock is not None:
                self._clock.record("input", "waiting", start_time, time.perf_counter(), item.number)
            yield item
