"""One pass over an epoch whose batches are made by Ray actors: the driver's side.

The Loader's process keeps the order. It sends whole batches ahead to the actors (``in_flight`` per actor, so
memory stays bounded) and takes their results strictly in batch order, so a slow actor delays the output but never
reorders it::

    batch:     k        k+1       k+2       k+3
    start:     s_k  ─►  e_k  ─►   e_k+1 ─►  ...      e_j: where batch j ends if none of its samples is skipped
    actor:     A        B         A         B

Batch ``k + 1`` is sent starting where batch ``k`` would end without a skip. When batch ``k`` comes back with a
skipped sample (a failed header, a failed decode: :mod:`.ray_take`), it ended later: the driver records the skips
(the Loader's ``skipped``, as locally), drops the results of the batches sent after it and sends them again from
the true end, with the new bad positions. An actor that dies is replaced in its slot and every batch it held is
sent again, unchanged: none is lost or repeated, since the driver, not the actor, decides what each batch holds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from stallfree.core.ray_cluster import answers
from stallfree.ingest.fields import IMAGE
from stallfree.pipeline.ray_transfer import bytes_of, received
from stallfree.pipeline.samples import BadSampleError, Batch
from stallfree.pipeline.skips import SkipPolicy

if TYPE_CHECKING:
    from stallfree.pipeline.ray_transfer import Finish
    from stallfree.pipeline.ray_workers import WorkerPool
    from stallfree.pipeline.run import Clock
    from stallfree.pipeline.run_config import RunParts

__all__: list[str] = []

_CHECK_S = 2.0  # seconds between checks that the cluster still answers while a batch is awaited


@dataclass(eq=False)
class _Flight:
    """A batch sent to the actor in ``slot``: ``args`` are :meth:`BatchTaker.take`'s, ``ref`` its result's ref."""

    number: int
    start: int
    slot: int
    args: tuple[Any, ...]
    ref: Any


class RayRun:
    """The batches of ``epoch`` (split from ``split``) from ``position`` (batch ``number``), made by ``pool``.

    A :class:`~stallfree.pipeline.run.Run`, as the local :class:`~stallfree.pipeline.epoch.EpochRun` is: iterating it
    yields :class:`Batch` objects in order; :meth:`stop` ends it.
    """

    def __init__(self, parts: RunParts, pool: WorkerPool, setup: tuple[str, tuple[Any, ...]], finish: Finish,
                 epoch: int, split: int, position: int, number: int, skipped: list[dict[str, Any]],
                 *, pin_memory: bool = False):
        self.parts, self.config, self.pool, self.finish = parts, parts.config, pool, finish
        self.key, self.setup = setup
        self.epoch, self.split, self.pin_memory = epoch, split, pin_memory
        self.n = parts.sampler.length(split)
        self.skips = SkipPolicy(self.config.on_error, parts.reader, epoch, self.n, skipped)
        self.total = self.config.batcher.batches(self.n)
        self.may_start_next = threading.Event()  # as EpochRun's; here once its last batch is out
        self.bytes_moved = 0  # bytes of batch outputs received from the actors
        self._flights: deque[_Flight] = deque()
        self._send_number, self._send_start, self._number = number, position, number
        self._stopped = False
        self._replaced = 0
        self._clock: Clock | None = None

    def attach(self, clock: Clock | None) -> None:
        """Report the run's spans (the actors' mapped onto this process's clock) to ``clock``."""
        self._clock = clock

    def stop(self) -> None:
        """Stop taking batches; those sent are cancelled (an actor finishes the one it is on)."""
        self._stopped = True
        self._drop_flights()

    def join(self, timeout: float) -> None:
        """Nothing runs in this process's threads (for EpochRun's interface)."""

    @property
    def stopped(self) -> bool:
        return self._stopped

    def ready(self) -> bool:
        import ray

        return bool(self._flights) and bool(ray.wait([self._flights[0].ref], timeout=0)[0])

    def _drop_flights(self) -> None:
        import ray

        flights, self._flights = list(self._flights), deque()
        if not ray.is_initialized():
            return
        for flight in flights:
            try:
                ray.cancel(flight.ref)
            except Exception:  # noqa: BLE001 - a batch already done or its actor gone: nothing to cancel
                continue

    def _end(self, start: int, size: int) -> int:
        """Where a batch of ``size`` from ``start`` ends when none of its samples is newly skipped."""
        if len(self.skips.bad) >= self.n:
            return start
        position, left = start, size
        while left:
            if not self.skips.is_bad(position):
                left -= 1
            position += 1
        return position

    def _fill(self) -> None:
        """Send batches ahead until every actor holds ``in_flight`` of them or the epoch's last one is sent."""
        slots = len(self.pool.actors)
        limit = self.pool.workers.in_flight
        while self._send_number < self.total and len(self._flights) < slots * limit:
            held = [0] * slots
            for flight in self._flights:
                held[flight.slot] += 1
            slot = min(range(slots), key=lambda s: held[s])
            size = self.config.batcher.size(self._send_number, self.n)
            args = (self.epoch, self.split, self._send_start, size, sorted(self.skips.bad), self.skips.first)
            ref = self.pool.submit(slot, self.key, self.setup, args)
            self._flights.append(_Flight(self._send_number, self._send_start, slot, args, ref))
            self._send_number += 1
            self._send_start = self._end(self._send_start, size)

    def _result(self, flight: _Flight) -> Any:
        """``flight``'s result; an actor that died is replaced and each batch it held is sent again.

        While it waits, the cluster's address is checked every :data:`_CHECK_S`: Ray itself ends the whole process a
        minute after its cluster went away, so the Loader leaves the cluster (``ray.shutdown``) and raises first.
        """
        import ray

        while True:
            try:
                ready, _ = ray.wait([flight.ref], timeout=_CHECK_S)
                if not ready:
                    self._check_cluster(flight)
                    continue
                return ray.get(flight.ref)
            except ray.exceptions.RayActorError as err:
                self._check_cluster(flight)
                self._replaced += 1
                if self._replaced > 2 * len(self.pool.actors) + 2:
                    raise RuntimeError(f"Ray actors of the Loader keep dying ({self._replaced} replaced this pass, "
                                       f"cluster {self.pool.address}); the last: {err}") from err
                dead = flight.slot
                self.pool.replace(dead)
                for other in self._flights:
                    if other.slot == dead:
                        other.ref = self.pool.submit(dead, self.key, self.setup, other.args)
            except ray.exceptions.RaySystemError as err:
                raise ConnectionError(f"the Ray cluster at {self.pool.address} went away while the Loader waited "
                                      f"for batch {flight.number}: {err}") from err

    def _check_cluster(self, flight: _Flight) -> None:
        """Raise ``ConnectionError`` naming the cluster once its address no longer answers (after leaving it)."""
        import ray

        if answers(self.pool.address):
            return
        self._stopped = True
        self._flights.clear()
        ray.shutdown()
        self.pool.workers.forget()
        raise ConnectionError(f"the Ray cluster at {self.pool.address} went away (its address no longer answers) "
                              f"while the Loader waited for batch {flight.number}; this process has left it: start "
                              "the cluster again and resume from the last state_dict()")

    def __iter__(self) -> Iterator[Batch]:
        while self._number < self.total and not self._stopped:
            self._fill()
            flight = self._flights[0]
            wait_start = time.perf_counter()
            result = self._result(flight)
            if self._clock is not None:
                self._clock.record("input", "waiting", wait_start, time.perf_counter(), flight.number)
            if self._stopped:
                return
            self._flights.popleft()
            if result.error is not None:
                kind, args = result.error
                raise BadSampleError(*args) if kind == "bad" else RuntimeError(*args)
            for record in result.skipped:
                self.skips.note(record)
            if result.skipped or (self._flights and self._flights[0].start != result.end):
                self._drop_flights()  # sent from where this batch would have ended: sent again from where it did
                self._send_number, self._send_start = flight.number + 1, result.end
            self._report(result, flight.number)
            self._number = flight.number + 1
            if self._number == self.total:
                self.may_start_next.set()
            rows = np.array(result.rows, dtype=np.int64, copy=True)  # Ray's zero-copy arrays are read-only
            yield Batch(flight.number, flight.start, result.end, rows, skipped=result.skipped,
                        fields={IMAGE.name: self._output(result.output, flight.number)})

    def _output(self, output: Any, number: int) -> torch.Tensor:
        """The worker's array as the Loader's batch, on its device."""
        self.bytes_moved += bytes_of(output)
        device = self.config.device
        if device.type != "cpu":
            start_time = time.perf_counter()
            images = received(output).pin_memory().to(device, non_blocking=True)
            out = self.finish(images)
            if self._clock is not None:
                self._clock.record("h2d", "busy", start_time, time.perf_counter(), number)
            return out
        out = self.finish(received(output))
        return out.pin_memory() if self.pin_memory else out

    def _report(self, result: Any, number: int) -> None:
        """The actor's busy spans on this process's clock (wall-clock times mapped onto ``perf_counter``)."""
        clock = self._clock
        if clock is None or not result.graph_end:
            return
        offset = time.perf_counter() - time.time()
        read_end = result.read_start + result.read_s
        clock.record("read", "busy", result.read_start + offset, read_end + offset, number)
        graph_start = max(result.graph_start, result.read_start)
        clock.record("augment", "busy", graph_start + offset, max(graph_start, result.graph_end) + offset, number)
