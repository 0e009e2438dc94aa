"""The reader stage of an epoch run: read the stream ahead, check each header, draw each sample's parameters.

It runs in its own thread (with ``io_threads`` more for the reads), so that disk reads overlap with the graph.
"""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stallfree.pipeline.host_read import HostRead

if TYPE_CHECKING:
    from stallfree.pipeline.epoch import EpochRun

__all__ = ["Chunk", "ReadStage"]


@dataclass
class Chunk:
    """Consecutive positions of a rank's stream as the reader found them, in order.

    ``entries`` holds ``(position, virtual id, fields, params)`` for a sample that passed the host checks and
    ``(position, None, record, None)`` for one that failed them (``record`` is ``None`` when it is known bad).
    """

    entries: list[tuple[int, int | None, Any, Any]]


class ReadStage:
    """Reads chunks of the run's stream onto its read queue: one per remaining batch, then one per replacement."""

    def __init__(self, run: EpochRun):
        self.run, self.parts, self.config = run, run.parts, run.config
        self.host = HostRead(run.parts)

    def loop(self, position: int, number: int) -> None:
        """Read the stream: a chunk of good samples per remaining batch, then one per sample the graph rejects."""
        run, config = self.run, self.config
        per_rank = len(run.order)
        batcher = config.batcher
        plan = [batcher.size(b, per_rank) for b in range(number, batcher.batches(per_rank))]
        known_bad = set(run.skips.bad)  # the reader's own view: what it skipped, and what the state carried
        with ThreadPoolExecutor(config.io_threads, thread_name_prefix="stallfree-read") as pool:
            while not run.stopped:
                if plan:
                    wanted = plan.pop(0)
                else:
                    try:
                        wanted = run.more.get(timeout=0.1)
                    except queue.Empty:
                        continue
                start_time = time.perf_counter()
                chunk, position = self._chunk(pool, position, wanted, known_bad)
                run.record("read", "busy", start_time, number)
                if not plan:  # the epoch is read (before its last chunk is queued, so before its last batch is out)
                    run.may_start_next.set()
                if not run.put(run.read_q, chunk):
                    return
                number += 1

    def _chunk(self, pool: ThreadPoolExecutor, position: int, wanted: int, known_bad: set[int]) -> tuple[Chunk, int]:
        """Read from ``position`` until ``wanted`` samples pass the host checks (header, size)."""
        run, parts, order = self.run, self.parts, self.run.order
        n = len(order)
        entries: list[tuple[int, int | None, Any, Any]] = []
        good: list[int] = []
        samples: list[dict[str, np.ndarray]] = []
        sizes: list[tuple[int, int]] = []
        if len(known_bad) >= n:
            return Chunk(entries), position  # nothing left to read; the graph stage reports it
        while len(good) < wanted:
            span = np.arange(position, position + wanted - len(good))
            position += len(span)
            keep = [int(p) for p in span if int(p) % n not in known_bad] if known_bad else span.tolist()
            if known_bad:
                entries.extend((int(p), None, None, None) for p in span if int(p) % n in known_bad)
            rows = parts.sampler.rows(order[np.asarray(keep, np.int64) % n]).tolist()
            for p, row, (fields, size, problem) in zip(keep, rows, self.host.rows(pool, rows), strict=True):
                if problem is not None:
                    known_bad.add(p % n)
                    entries.append((p, None, run.skips.record(p, int(row), problem), None))
                    continue
                good.append(p)
                samples.append(fields)
                sizes.append(size)
            if len(known_bad) >= n:
                break
        if good:
            virtual = order[np.asarray(good, np.int64) % n]
            params = self.host.draw(run.epoch, virtual.tolist(), sizes)
            names = list(params)
            for i, p in enumerate(good):
                entries.append((p, int(virtual[i]), samples[i], tuple(params[name][i] for name in names)))
        entries.sort(key=lambda entry: entry[0])
        return Chunk(entries), position
