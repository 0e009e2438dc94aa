"""The graph stage of an epoch run: take each batch's samples from the stream, run the DALI graph, copy out.

Two batches are in the graph at once: batch ``k + 1`` is taken from the stream and fed while batch ``k`` runs, so
that DALI's threads do not wait while a batch is fed and the one before is handed over (docs/speed.md); when the
reader has not yet read batch ``k + 1``'s samples, batch ``k`` is handed over first, without waiting. Which
samples a batch holds is what it would be one batch at a time. When batch ``k`` fails in the graph, batch
``k + 1`` gives its samples back to the stream (the replacements it asked for are credited, so none is asked for
twice), batch ``k`` takes its replacements from them, and batch ``k + 1`` is taken again.

A sample that fails in the graph is skipped (or raised, as ``on_error`` says) and the graph runs again on the
rest, with the reader asked for as many replacements (DALI cannot skip inside a running graph:
NVIDIA/DALI#3913).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stallfree.ingest.fields import IMAGE
from stallfree.pipeline.graph import GraphError, Ticket
from stallfree.pipeline.samples import Batch

if TYPE_CHECKING:
    from stallfree.pipeline.epoch import EpochRun

__all__ = ["GraphStage"]

class _NotRead(Exception):
    """The stream's next entries are not read yet (a look-ahead take does not wait for them)."""


#: One entry of the stream: ``(position, virtual id or None, fields or skip record, params)`` (read_stage.Chunk).
Entry = tuple[int, int | None, Any, Any]


@dataclass(eq=False)
class _Take:
    """Batch ``number``'s samples as taken from the stream, from position ``start``, and what taking them did."""

    number: int
    size: int
    start: int
    first_skip: dict[str, Any] | None  # the run's first skip before this batch: restored if it gives its samples back
    consumed: list[Entry] = field(default_factory=list)  # every entry taken from the stream, in order
    taken: list[Entry] = field(default_factory=list)  # those going into the graph
    skipped: list[dict[str, Any]] = field(default_factory=list)
    requested: int = 0  # replacements asked of the reader for samples that failed in the graph earlier
    end: int = 0
    ticket: Ticket | None = None
    inputs: tuple[list[np.ndarray], dict[str, list[np.ndarray]]] | None = None  # ``taken``'s, as fed to the graph
    fed: float = 0.0


class GraphStage:
    """Builds the run's batches from its read queue onto its output queue, in order."""

    def __init__(self, run: EpochRun, position: int):
        self.run, self.parts, self.config = run, run.parts, run.config
        self._pending: list[Entry] = []
        self._cursor = position
        self._credit = 0  # replacements asked for by batches that gave their samples back
        self._broken: Exception | None = None  # the reader's failure, raised wherever the stream reaches it
        self._graph_free = 0.0  # when the graph finished the batch before (the start of the next one's busy span)
        self._sent = 0.0  # when the batch before was on the output queue (the stage waited for the loop until then)

    def loop(self, first: int) -> None:
        with self.run.graph.lock:  # a pass ended from outside may still be finishing its batch in the graph
            try:
                self._loop(first)
            finally:
                self.run.graph.drain()  # a stopped or failed pass leaves nothing in the graph for the next one

    def _loop(self, first: int) -> None:
        run, config = self.run, self.config
        per_rank = len(run.order)
        flying: _Take | None = None
        number = first
        batcher = config.batcher
        while number < batcher.batches(per_rank):
            fresh = _Take(number, batcher.size(number, per_rank), self._cursor, run.skips.first)
            try:
                take = self._take(fresh, wait=flying is None)  # a look-ahead (a batch in the graph) does not wait
            except Exception:
                if flying is None:
                    raise
                # The reader is behind (_NotRead), or the stream failed: the batch in the graph comes first, as it
                # would one batch at a time; then this one is taken again (and fails again, if it failed).
                done, flying = self._deliver(flying, None), None
                if not done:
                    return
                continue
            if take is None:
                return
            self._submit(take)
            if flying is not None:
                done, flying = self._deliver(flying, take), None
                if not done:
                    return
                if take.ticket is None:  # given back: the batch before took replacements from it
                    continue
            flying = take
            number += 1
        if flying is not None:
            self._deliver(flying, None)

    def _deliver(self, take: _Take, following: _Take | None) -> bool:
        """Batch ``take`` out of the graph (:meth:`_finish`) and onto the output queue; ``False`` once stopped."""
        batch = self._finish(take, following)
        sent = batch is not None and self._send(batch)
        self._sent = time.perf_counter()
        return sent

    def _send(self, batch: Batch) -> bool:
        run, device = self.run, self.config.device
        image = batch.fields.get(IMAGE.name)
        if image is not None and image.device != device:
            start_time = time.perf_counter()
            batch.fields[IMAGE.name] = image.pin_memory().to(device, non_blocking=True)
            run.record("h2d", "busy", start_time, batch.number)
        return run.put(run.out_q, batch)

    def _entry(self, wait: bool) -> Entry | None:
        """The next entry of the stream (``None`` once stopped); a reader failure is raised here, and again.

        Raises:
            _NotRead: ``wait`` is false and the reader has not read the entry yet.
        """
        while not self._pending:
            if self._broken is not None:
                raise self._broken
            if not wait and self.run.read_q.empty():
                raise _NotRead
            try:
                item = self.run.get(self.run.read_q)
            except Exception as err:
                self._broken = err
                raise
            if item is None:
                return None
            self._pending = item.entries[::-1]
        return self._pending.pop()

    def _note_skip(self, record: dict[str, Any], skipped: list[dict[str, Any]]) -> None:
        self.run.skips.note(record)
        skipped.append(record)

    def _take(self, take: _Take, *, wait: bool = True) -> _Take | None:
        """Fill ``take`` up to its size with the stream's next good samples; ``None`` once the run is stopped.

        On a failure (or, without ``wait``, at an entry not read yet) the batch gives back what it took before the
        failure is raised.
        """
        run = self.run
        try:
            while len(take.taken) < take.size:
                run.skips.check_left()
                entry = self._entry(wait)
                if entry is None:
                    return None
                take.consumed.append(entry)
                position, virtual, payload, _ = entry
                self._cursor = position + 1
                if virtual is None:  # failed the host checks
                    if payload is not None:
                        self._note_skip(payload, take.skipped)
                elif run.skips.is_bad(position):  # failed in the graph earlier this epoch: replace it
                    take.requested += 1
                    if self._credit:
                        self._credit -= 1
                    else:
                        run.more.put(1)
                else:
                    take.taken.append(entry)
        except Exception:  # _NotRead too
            self._give_back(take)
            raise
        take.end = self._cursor
        return take

    def _give_back(self, take: _Take) -> None:
        """Return ``take``'s entries to the stream, as if it had not been taken (the graph drops its batch)."""
        if take.ticket is not None:
            self.run.graph.drain()
            take.ticket = None
        self._pending.extend(reversed(take.consumed))
        self._cursor = take.start
        self._credit += take.requested
        self.run.skips.first = take.first_skip
        take.consumed, take.taken, take.skipped, take.requested, take.inputs = [], [], [], 0, None

    def _inputs(self, take: _Take) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:
        names = list(self.parts.compiled.param_inputs)
        images = [t[2][IMAGE.name] for t in take.taken]
        return images, {name: [t[3][j] for t in take.taken] for j, name in enumerate(names)}

    def _submit(self, take: _Take) -> None:
        take.inputs = self._inputs(take)
        take.ticket = self.run.graph.submit(*take.inputs)
        take.fed = time.perf_counter()

    def _finish(self, take: _Take, following: _Take | None) -> Batch | None:
        """Batch ``take`` out of the graph; ``None`` once the run is stopped.

        If it fails in the graph, ``following`` (the batch fed after it) gives its samples back first, and the
        failed samples are replaced from the stream, running the graph again until the batch passes.
        """
        run, parts = self.run, self.parts
        while True:
            images, params = take.inputs or self._inputs(take)
            rows = parts.sampler.rows(np.asarray([t[1] for t in take.taken], np.int64))
            # The graph's busy span: not the wait for the reader, nor the wait for room on the output queue (a slow
            # training step), which the queue's own "waiting" span counts.
            start_time = max(take.fed, self._graph_free, self._sent)
            try:
                if take.ticket is not None:
                    ticket, take.ticket = take.ticket, None
                    output = run.graph.collect(ticket)
                else:
                    output = run.graph.run(images, params)
                self._graph_free = time.perf_counter()
                run.record("augment", "busy", start_time, take.number)
            except GraphError as failure:
                self._graph_free = time.perf_counter()
                run.record("augment", "busy", start_time, take.number)
                if following is not None and following.ticket is not None:
                    self._give_back(following)
                positions = [t[0] for t in take.taken]
                take.skipped.extend(run.skips.graph_failure(failure, positions, rows))
                bad = set(failure.bad)
                take.taken = [t for i, t in enumerate(take.taken) if i not in bad]
                take.inputs = None
                run.more.put(len(bad))
                if self._take(take) is None:
                    return None
                continue
            return Batch(take.number, take.start, take.end, rows, take.skipped, {IMAGE.name: output})
