"""The graph stage of an epoch run: take each batch's samples from the stream, run the DALI graph, copy out.

A sample that fails in the graph is skipped (or raised, as ``on_error`` says) and the graph runs again on the
rest, with the reader asked for as many replacements (DALI cannot skip inside a running graph:
NVIDIA/DALI#3913).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from stallfree.pipeline.graph import GraphError
from stallfree.pipeline.samples import BadSampleError, Batch

if TYPE_CHECKING:
    from stallfree.pipeline.epoch import EpochRun

__all__ = ["GraphStage"]


class GraphStage:
    """Builds the run's batches from its read queue onto its output queue, in order."""

    def __init__(self, run: EpochRun, position: int):
        self.run, self.loader = run, run.loader
        self._pending: list[tuple[int, int | None, Any, Any]] = []
        self._cursor = position

    def loop(self, first: int) -> None:
        run, loader = self.run, self.loader
        per_rank = len(run.order)
        for number in range(first, loader._batches(per_rank)):
            batch = self._assemble(number, loader._batch_len(number, per_rank))
            if batch is None:
                return
            if batch.output is not None and batch.output.device != loader.device:
                start_time = time.perf_counter()
                batch.output = batch.output.pin_memory().to(loader.device, non_blocking=True)
                run.record("h2d", "busy", start_time, number)
            if not run.put(run.out_q, batch):
                return

    def _entry(self) -> tuple[int, int | None, Any, Any] | None:
        """The next entry of the stream (``None`` once stopped); a reader failure is raised here."""
        while not self._pending:
            item = self.run.get(self.run.read_q)
            if item is None:
                return None
            self._pending = item.entries[::-1]
        return self._pending.pop()

    def _note_skip(self, record: dict[str, Any], skipped: list[dict[str, Any]]) -> None:
        run = self.run
        run.bad.add(int(record["position"]) % len(run.order))
        skipped.append(record)
        run.first_skip = run.first_skip or record
        self._check_left()

    def _check_left(self) -> None:
        """Raise once every position of the epoch is skipped: no sample is left to fill a batch with."""
        run = self.run
        first = run.first_skip
        if len(run.bad) >= len(run.order) and first is not None:
            raise RuntimeError(
                f"every sample of this rank's epoch was skipped ({len(run.order)} samples; the first: "
                f"{first['source']}: {first['reason']}); check the data, or the transforms if every sample fails "
                "in the graph"
            )

    def _assemble(self, number: int, size: int) -> Batch | None:
        """Batch ``number``: the next ``size`` good samples of the stream, through the graph."""
        run, loader, start, n = self.run, self.loader, self._cursor, len(self.run.order)
        taken: list[tuple[int, int, Any, Any]] = []
        skipped: list[dict[str, Any]] = []
        names = list(loader.compiled.param_inputs)
        while True:
            while len(taken) < size:
                self._check_left()
                entry = self._entry()
                if entry is None:
                    return None
                position, virtual, payload, params = entry
                self._cursor = position + 1
                if virtual is None:  # failed the host checks
                    if payload is not None:
                        self._note_skip(payload, skipped)
                elif position % n in run.bad:  # failed in the graph earlier this epoch: replace it
                    run.more.put(1)
                else:
                    taken.append((position, virtual, payload, params))
            images = [t[2] for t in taken]
            params = {name: [t[3][j] for t in taken] for j, name in enumerate(names)}
            rows = loader.sampler.rows(np.asarray([t[1] for t in taken], np.int64))
            start_time = time.perf_counter()  # the graph's busy span, not the wait for the reader's samples
            try:
                output = run.graph.run(images, params)
                run.record("augment", "busy", start_time, number)
            except GraphError as failure:
                run.record("augment", "busy", start_time, number)
                if not failure.bad or loader.on_error == "raise":
                    row = int(rows[failure.bad[0] if failure.bad else 0])
                    reason = failure.reasons[0] if failure.bad else str(failure)
                    raise BadSampleError(loader.reader.describe(row), row, f"decoding failed: {reason}") from failure
                for i, reason in zip(failure.bad, failure.reasons, strict=True):
                    self._note_skip(run.skip(taken[i][0], int(rows[i]), f"decoding failed: {reason}"), skipped)
                bad = set(failure.bad)
                taken = [t for i, t in enumerate(taken) if i not in bad]
                run.more.put(len(bad))
                continue
            return Batch(number, start, self._cursor, rows, images, params, skipped, output)
