"""One batch taken on a Ray worker: the samples the local Loader's batch ``k`` holds, read, checked and run there.

The driver says where batch ``k`` starts in the rank's stream (position ``start``), how many samples it holds and
which positions are already known bad; the worker takes, as the local epoch run does, the next good positions:

    start ─► read the next ``size - taken`` positions not known bad ─► header check ─► draw params ─► DALI graph
               ▲                      a failed header: skip, take the next position ──┘          │
               └─────────────── a sample that fails in the graph: skip, take the next ───────────┘

so the batch's samples, its skip records (in the local order: each round's header failures, then its graph
failures) and the position after its last sample are the local Loader's. Every draw is keyed by
``(seed, epoch, sample)``, so the pixels are too. The driver (:mod:`.ray_run`) keeps the order of the batches and
redoes the ones it sent ahead when a batch skipped samples, since their start moved.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stallfree.ingest.fields import IMAGE
from stallfree.pipeline.graph import Graph, GraphError
from stallfree.pipeline.host_read import HostRead, Size
from stallfree.pipeline.samples import BadSampleError
from stallfree.pipeline.skips import SkipPolicy

if TYPE_CHECKING:
    from stallfree.pipeline.run_config import RunParts
    from stallfree.transforms.compile import CompiledTransforms

__all__: list[str] = []


@dataclass
class TakeResult:
    """What a worker sends back for one batch (all picklable; ``output`` is a numpy array or a tensor).

    ``error`` is ``(kind, args)`` for a failure the driver raises as the local Loader would: ``("bad", (source,
    index, reason))`` for :class:`BadSampleError`, ``("runtime", (message,))`` for ``RuntimeError``.
    """

    end: int = 0
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    skipped: list[dict[str, Any]] = field(default_factory=list)
    output: Any = None
    error: tuple[str, tuple[Any, ...]] | None = None
    read_s: float = 0.0  # wall-clock (time.time) spans of the worker's busy time: reading, then the graph
    read_start: float = 0.0
    graph_start: float = 0.0
    graph_end: float = 0.0


class _Epoch:
    """The order of one ``(epoch, split)``, computed once per worker and reused by its batches."""

    def __init__(self, parts: RunParts, epoch: int, split: int):
        self.epoch, self.split = epoch, split
        self.order = parts.sampler.virtual_order(epoch, split)


class BatchTaker:
    """Takes batches on a worker from the run's parts and a graph of its own.

    Args:
        parts: the Loader's run parts (without its clock).
        compiled: the spec the worker's graph runs (the Loader's, or for ``transfer="uint8"`` the spec up to its
            last ``Normalize``, with uint8 NHWC output).
        num_threads: DALI's threads on the worker.
    """

    def __init__(self, parts: RunParts, compiled: CompiledTransforms, num_threads: int):
        config = parts.config
        self.parts, self.config, self.compiled = parts, config, compiled
        self.graph = Graph(compiled, batch_size=config.batcher.largest, num_threads=num_threads, device_id=None,
                           encoded=config.encoded, seed=config.seed, exif=config.exif)
        self.host = HostRead(parts, compiled)
        self._epoch: _Epoch | None = None
        self._pool = ThreadPoolExecutor(max(1, config.io_threads), thread_name_prefix="stallfree-ray-read")

    def close(self) -> None:
        """Let its read threads go (the actor dropped this setup to make room for another Loader's)."""
        self._pool.shutdown(wait=False)

    def take(self, epoch: int, split: int, start: int, size: int, bad: list[int],
             first: dict[str, Any] | None) -> TakeResult:
        """Batch of ``size`` samples from ``start``.

        ``bad``: the epoch's known bad positions (modulo its length); ``first``: its first skip record, if any (named
        when every sample is skipped).
        """
        if self._epoch is None or (self._epoch.epoch, self._epoch.split) != (epoch, split):
            self._epoch = _Epoch(self.parts, epoch, split)
        result = TakeResult(read_start=time.time())
        skips = SkipPolicy(self.config.on_error, self.parts.reader, epoch, len(self._epoch.order))
        skips.bad, skips.first = set(bad), first
        try:
            self._take(self._epoch, start, size, skips, result)
        except BadSampleError as err:
            result.error = ("bad", (err.source, err.index, err.reason))
        except RuntimeError as err:  # every sample skipped, or the graph (not the data) fails
            result.error = ("runtime", (str(err),))
        return result

    def _take(self, epoch: _Epoch, start: int, size: int, skips: SkipPolicy, result: TakeResult) -> None:
        position = start
        taken: list[tuple[int, int, dict[str, np.ndarray], Size]] = []  # (position, virtual id, fields, size)
        while True:
            read_start = time.time()
            while len(taken) < size:
                position, fresh = self._read(epoch, position, size - len(taken), skips, result.skipped)
                taken.extend(fresh)
            taken.sort(key=lambda item: item[0])
            result.read_s += time.time() - read_start
            virtual = [item[1] for item in taken]
            params = self.host.draw(epoch.epoch, virtual, [item[3] for item in taken])
            rows = self.parts.sampler.rows(np.asarray(virtual, np.int64))
            result.graph_start = time.time()
            try:
                output = self.graph.run([item[2][IMAGE.name] for item in taken], params)
            except GraphError as failure:
                result.graph_end = time.time()
                positions = [item[0] for item in taken]
                result.skipped.extend(skips.graph_failure(failure, positions, rows))
                failed = set(failure.bad)
                taken = [item for i, item in enumerate(taken) if i not in failed]
                continue
            result.graph_end = time.time()
            result.end, result.rows = position, rows
            result.output = _portable(output, channels_last=self.compiled.layout == "channels_last")
            return

    def _read(self, epoch: _Epoch, position: int, wanted: int, skips: SkipPolicy,
              skipped: list[dict[str, Any]]) -> tuple[int, list[tuple[int, int, dict[str, np.ndarray], Size]]]:
        """The next ``wanted`` positions from ``position`` not known bad, read and header-checked, in order."""
        order, n = epoch.order, len(epoch.order)
        positions: list[int] = []
        while len(positions) < wanted:
            skips.check_left()
            if not skips.is_bad(position):
                positions.append(position)
            position += 1
        virtual = order[np.asarray(positions, np.int64) % n]
        rows = self.parts.sampler.rows(virtual).tolist()
        good = []
        for p, v, row, (fields, size, problem) in zip(positions, virtual.tolist(), rows,
                                                    self.host.rows(self._pool, rows), strict=True):
            if problem is not None:
                skipped.append(skips.skip(p, int(row), problem))
                continue
            good.append((p, int(v), fields, size))
        return position, good


def _portable(output: Any, *, channels_last: bool) -> Any:
    """The graph's tensor as something that leaves the worker: a copy of its memory (DALI reuses its own).

    A numpy array, zero-copy through Ray's object store; bfloat16, which numpy lacks, travels as a tensor.
    ``channels_last`` (NCHW shape over NHWC memory) travels as the NHWC array; the driver views it as NCHW again.
    """
    import torch

    if channels_last:
        output = output.permute(0, 2, 3, 1)
    if output.dtype == torch.bfloat16:
        return output.contiguous().clone()
    return np.array(output.numpy(), copy=True, order="C")
