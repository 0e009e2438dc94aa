"""A pass over token sequences: each batch's packs (or documents) read and assembled, in a thread of its own.

Token samples have no graph to run: the thread reads each batch's documents from the reader (Arrow, no copy where
the layout allows) and assembles the batch's arrays (:class:`PackedBatches` for packs, :class:`PaddedBatches` for
documents padded to the batch's longest), so the training loop's ``next`` only takes a ready batch. It is a
:class:`~stallfree.pipeline.run.Run` as the image runs are: a pass, its cursor, resume and the stage clock treat it
alike. A bad document is refused when its reader opens (``on_error``), so a token run never skips.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from stallfree.ingest.fields import TOKENS
from stallfree.pipeline.packing import EMPTY, PackOrder, PackPlan
from stallfree.pipeline.priority import lowered, run_at
from stallfree.pipeline.reader_base import sample_of
from stallfree.pipeline.samples import Batch

if TYPE_CHECKING:
    from stallfree.pipeline.batcher import CountBatcher
    from stallfree.pipeline.reader_base import Reader
    from stallfree.pipeline.run import Clock
    from stallfree.pipeline.run_config import RunParts
    from stallfree.pipeline.sampler import Order

__all__ = ["SKIPPED", "PackedBatches", "PaddedBatches", "TokenParts", "TokenPlacement", "TokenRun"]

IGNORE = -100  # Hugging Face's label for a position that is not predicted
#: The key under which a builder hands its batch's skip records to the run (an image-text document whose image
#: fails, :mod:`.image_text_run`); the run takes it out of the batch's fields.
SKIPPED = "_skipped"


class Builder(Protocol):
    """Assembles one batch's arrays from the ids the order deals."""

    def __call__(self, ids: np.ndarray, epoch: int) -> tuple[np.ndarray, dict[str, Any]]:
        """The batch's document rows and its fields."""
        ...

    def follow(self, ids: np.ndarray, epoch: int) -> None:
        """Tell the reader the rows ``ids`` will read, in order (a remote reader fetches their shards ahead)."""
        ...


def _tokens(reader: Reader, row: int) -> np.ndarray:
    return sample_of(reader.read(int(row)))[TOKENS.name]


@dataclass(frozen=True, eq=False)
class PackedBatches:
    """Packs as ``[B, S]`` rows: ``input_ids``, ``labels``, ``position_ids``, ``document_index``, ``cu_seqlens``."""

    order: PackOrder
    reader: Reader

    def __call__(self, ids: np.ndarray, epoch: int) -> tuple[np.ndarray, dict[str, Any]]:
        plan, packing = self.order.plan(epoch), self.order.packing
        seq, rows_n = int(packing.seq_len), self.order.num_rows
        shape = (len(ids), seq)
        input_ids = np.full(shape, packing.pad_id, np.int64)
        labels = np.full(shape, IGNORE, np.int64)
        positions = np.zeros(shape, np.int64)
        documents = np.full(shape, -1, np.int64)
        segments: list[int] = []
        rows: list[int] = []
        for r, pack in enumerate(ids.tolist()):
            col = 0
            for i in _pieces(plan, pack):
                row = int(plan.virtual[i]) % rows_n
                begin, end = int(plan.begin[i]), int(plan.end[i])
                n, stop = end - begin, col + end - begin
                input_ids[r, col:stop] = _tokens(self.reader, row)[begin:end]
                labels[r, col + 1 : stop] = input_ids[r, col + 1 : stop]  # the piece's first token is not predicted
                positions[r, col:stop] = np.arange(begin, end)
                documents[r, col:stop] = row
                segments.append(n)
                rows.append(row)
                col = stop
            if col < seq:  # the row's padding: a segment of its own
                positions[r, col:] = np.arange(seq - col)
                segments.append(seq - col)
        cu = np.zeros(len(segments) + 1, np.int32)
        np.cumsum(segments, out=cu[1:])
        fields = {"input_ids": input_ids, "labels": labels, "position_ids": positions, "document_index": documents,
                  "cu_seqlens": cu, "max_seqlen": int(max(segments))}
        return np.asarray(rows, np.int64), fields

    def follow(self, ids: np.ndarray, epoch: int) -> None:
        plan = self.order.plan(epoch)
        pieces = [plan.virtual[_pieces(plan, int(pack))] for pack in ids.tolist()]
        virtual = np.concatenate(pieces) if pieces else np.empty(0, np.int64)
        self.reader.follow(np.asarray(virtual, np.int64) % self.order.num_rows)


def _pieces(plan: PackPlan, pack: int) -> range:
    return range(0) if pack == EMPTY else range(int(plan.starts[pack]), int(plan.starts[pack + 1]))


@dataclass(frozen=True, eq=False)
class PaddedBatches:
    """Documents padded to the batch's longest: ``input_ids``, ``attention_mask``, ``labels``, ``document_index``.

    As ``DataCollatorForLanguageModeling(mlm=False)`` pads a batch: the baseline packing is measured against.
    """

    order: Order
    reader: Reader
    pad_id: int = 0

    def __call__(self, ids: np.ndarray, epoch: int) -> tuple[np.ndarray, dict[str, Any]]:
        rows = self.order.rows(ids)
        docs = [_tokens(self.reader, row) for row in rows.tolist()]
        longest = max(len(d) for d in docs)
        input_ids = np.full((len(docs), longest), self.pad_id, np.int64)
        mask = np.zeros((len(docs), longest), np.int64)
        for r, doc in enumerate(docs):
            input_ids[r, : len(doc)], mask[r, : len(doc)] = doc, 1
        labels = np.where(mask == 1, input_ids, IGNORE)
        return rows, {"input_ids": input_ids, "attention_mask": mask, "labels": labels, "document_index": rows.copy()}

    def follow(self, ids: np.ndarray, epoch: int) -> None:
        self.reader.follow(self.order.rows(ids))


@dataclass(frozen=True, eq=False)
class TokenParts:
    """What a token run is made of: the order it reads, what a batch is, how one is assembled, batches ahead."""

    order: Order
    batcher: CountBatcher
    build: Builder
    prefetch: int


_DONE = object()
_RUNNING: weakref.WeakSet[TokenRun] = weakref.WeakSet()


@atexit.register
def _stop_running_token_runs() -> None:
    """Stop and join every token run before the interpreter shuts down.

    A run's thread still making the next epoch's batches (started ahead) while the interpreter finalizes aborts the
    process ("terminate called without an active exception", exit 134) in about one exit in ten.
    """
    runs = list(_RUNNING)
    for run in runs:
        run.stop()
    for run in runs:
        run.join(timeout=10.0)


class TokenRun:
    """The batches of ``epoch`` (split from ``split``) from batch ``number`` on (``position`` is its first id)."""

    def __init__(self, parts: TokenParts, epoch: int, split: int, position: int, number: int):
        self.parts, self.epoch, self.start = parts, epoch, (split, position, number)
        self.ids = parts.order.virtual_order(epoch, split)
        self.may_start_next = threading.Event()
        self._out: queue.Queue[Any] = queue.Queue(parts.prefetch)
        self._stop = threading.Event()
        self._clock: Clock | None = None
        self._held: list[tuple[str, str, float, float, int]] | None = []
        self._lock = threading.Lock()
        self._nice = lowered()
        self._thread = threading.Thread(target=self._loop, args=(number,), daemon=True, name="stallfree-tokens")
        _RUNNING.add(self)
        self._thread.start()
        run_at(self._nice, self._thread.native_id)

    def _loop(self, number: int) -> None:
        batcher, per_rank = self.parts.batcher, len(self.ids)
        try:
            run_at(self._nice)  # the training loop gets a core when it wants one (priority.py)
            self.parts.build.follow(self.ids[number * batcher.largest :], self.epoch)
            for k in range(number, batcher.batches(per_rank)):
                if self._stop.is_set():
                    return
                start_time = time.perf_counter()
                lo = k * batcher.largest
                ids = self.ids[lo : lo + batcher.size(k, per_rank)]
                rows, arrays = self.parts.build(ids, self.epoch)
                skipped = arrays.pop(SKIPPED, [])
                for record in skipped:  # where the pack stands in the rank's stream
                    record["position"] = lo + int(record.pop("pack"))
                fields = {name: torch.from_numpy(a) if isinstance(a, np.ndarray) else a for name, a in arrays.items()}
                self._record("read", start_time, k)
                if k == batcher.batches(per_rank) - 1:
                    self.may_start_next.set()
                if not self._put(Batch(k, lo, lo + len(ids), rows, skipped, fields)):
                    return
        except BaseException as err:  # noqa: BLE001 - every failure reaches the training loop, none is lost
            self._put(err)
            return
        self.may_start_next.set()
        self._put(_DONE)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _record(self, stage: str, start: float, batch: int) -> None:
        span = (stage, "busy", start, time.perf_counter(), batch)
        with self._lock:
            if self._held is not None:
                self._held.append(span)
                return
        if self._clock is not None:
            self._clock.record(*span)

    def ready(self) -> bool:
        return self._out.qsize() > 0

    def __iter__(self) -> Iterator[Batch]:
        while True:
            start_time = time.perf_counter()
            try:
                item = self._out.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            if self._clock is not None:
                self._clock.record("input", "waiting", start_time, time.perf_counter(), item.number)
            yield item

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def attach(self, clock: Clock | None) -> None:
        with self._lock:
            held, self._held, self._clock = self._held or [], None, clock
        if clock is not None:
            for span in held:
                clock.record(*span)


class TokenPlacement:
    """Token runs in this process, the next epoch's started ahead as a Loader's image runs are.

    Args:
        prefetch: batches a run makes ahead of the training loop.
        pad_id: the padding id of documents padded to a batch's longest (packs carry their packing's).
    """

    def __init__(self, prefetch: int, pad_id: int = 0):
        self.prefetch, self.pad_id = prefetch, pad_id
        self._ahead: TokenRun | None = None

    def _parts(self, parts: RunParts) -> TokenParts:
        order = parts.sampler
        build: Builder = (PackedBatches(order, parts.reader) if isinstance(order, PackOrder)
                          else PaddedBatches(order, parts.reader, self.pad_id))
        return TokenParts(order, parts.config.batcher, build, self.prefetch)

    def run(self, parts: RunParts, epoch: int, split: int, position: int, number: int,
            skipped: list[dict[str, Any]]) -> TokenRun:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            same = (ahead.parts.order == parts.sampler and ahead.epoch == epoch
                    and ahead.start == (split, position, number))
            if same and not ahead.stopped:
                return ahead
            ahead.stop()
        return TokenRun(self._parts(parts), epoch, split, position, number)

    def start_ahead(self, parts: RunParts, epoch: int) -> None:
        self.discard()
        self._ahead = TokenRun(self._parts(parts), epoch, 0, 0, 0)

    def discard(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.stop()
