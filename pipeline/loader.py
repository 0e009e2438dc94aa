"""The Loader: a drop-in for ``torch.utils.data.DataLoader`` whose decode and augmentation run in a DALI graph.

Three stages run at once, joined by bounded queues, so that disk reads overlap with decoding and decoding with
the training step::

    reader thread                       graph thread                       the training loop
    rows from the sampler ─► read bytes ─► DALI: decode + transforms ─► ─► next(loader) ─► (images, labels)
    check headers, draw params  [queue]    hand-off to torch (DLPack)  [queue]

The state a checkpoint holds counts batches *delivered to the user*, never batches prefetched, so a resumed
Loader yields bit-identical batches from the next one on (DESIGN.md, "Known pitfalls").
"""

from __future__ import annotations

import atexit
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import torch

from stallfree.pipeline.graph import Graph, GraphError
from stallfree.pipeline.headers import DEFAULT_MAX_PIXELS, EXIF_MODES, BadImage, Exif, read_header
from stallfree.pipeline.readers import Reader, open_source
from stallfree.pipeline.sampler import Sampler
from stallfree.transforms.compile import CompiledTransforms, Dtype, Layout
from stallfree.transforms.random import batch_random
from stallfree.transforms.spec import Transform

__all__ = ["BadSampleError", "Clock", "Loader"]

STATE_VERSION = 1


class Clock(Protocol):
    """Where the Loader reports its spans (``stallfree.stage_runtime.clock.StageClock`` is one)."""

    def record(self, stage: str, state: str, start: float, end: float, batch: int | None = None) -> None:
        """Record that ``stage`` was ``state`` ("busy" or "waiting") from ``start`` to ``end`` (perf_counter)."""


class BadSampleError(RuntimeError):
    """A sample that cannot be decoded, with ``source`` (its file or shard row), ``index`` and ``reason``."""

    def __init__(self, source: str, index: int, reason: str):
        super().__init__(f"{source} (sample {index}): {reason}; pass on_error='skip' to skip such samples")
        self.source, self.index, self.reason = source, index, reason


@dataclass
class _Batch:
    """A batch on its way through the stages; ``start``/``end`` are positions in the rank's order."""

    number: int
    start: int
    end: int
    rows: np.ndarray
    images: list[np.ndarray] = field(default_factory=list)
    params: dict[str, list[np.ndarray]] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    output: torch.Tensor | None = None


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_DONE = object()
_RUNNING: weakref.WeakSet[_EpochRun] = weakref.WeakSet()


@atexit.register  # registered after DALI's own hook (graph imports DALI first), so it runs before it
def _stop_running_epochs() -> None:
    """Let no graph run while the interpreter shuts DALI down (that aborts the process)."""
    runs = list(_RUNNING)
    for run in runs:
        run.stop()
    for run in runs:
        run.join(timeout=10.0)


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {str(device)!r}") from err
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} but torch sees no CUDA device; use device='cpu'")
        return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    if dev.type != "cpu":
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {str(device)!r}")
    return dev


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return (
            dist.get_rank() if rank is None else rank,
            dist.get_world_size() if world_size is None else world_size,
        )
    return (rank or 0), (world_size or 1)


class Loader:
    """Batches of ``(images, labels)`` torch tensors, decoded and augmented in a DALI graph.

    The three-line switch from a DataLoader::

        loader = stallfree.Loader("train/", batch_size=256, device="cuda",
                                  transform=[RandomResizedCrop(224), RandomHorizontalFlip(), Normalize()])
        for images, labels in loader: ...

    Args:
        source: an ImageFolder tree, a CSV or Parquet file list (``path``, ``label``), an ingested shard folder,
            a map-style torch ``Dataset`` of ``(image, label)`` items (see :class:`DatasetReader`), or a
            :class:`Reader`.
        batch_size: samples per batch.
        transform: the augmentation spec (``stallfree.transforms``); it must end at a fixed size.
        shuffle: a global permutation per ``(seed, epoch)``; ``False`` for evaluation (row order).
        seed: seeds the order and every random augmentation parameter; the same on every rank.
        drop_last: as ``DistributedSampler(drop_last=True)`` plus ``DataLoader(drop_last=True)``: truncate so
            every rank has the same number of samples, and drop the last incomplete batch. Without it, ranks are
            padded to the same count with samples from the start of the permutation (so a few samples appear
            twice in an epoch when the dataset does not divide by ``world_size``), and the last batch may be short.
        rank, world_size: this process's shard; taken from ``torch.distributed`` when it is initialised.
        device: ``"cpu"`` or ``"cuda[:N]"``: where the batches are delivered.
        placement: where the graph runs: ``"auto"`` (the GPU when ``device`` is CUDA), ``"cpu"`` or ``"gpu"``.
        num_threads: DALI worker threads (default: the cores this process may use).
        prefetch: batches each stage may run ahead of the training loop.
        io_threads: threads reading files for the reader stage.
        echo: data echoing factor ``k`` (Choi et al.): each sample (``echo_mode="example"``, each repeat freshly
            augmented and spread by the shuffle) or each batch (``"batch"``, yielded ``k`` times) ``k`` times.
        echo_mode: ``"example"`` or ``"batch"``.
        on_error: ``"raise"`` raises :class:`BadSampleError` naming the file; ``"skip"`` fills the batch with the
            next samples and lists each skipped one in :attr:`skipped`.
        max_pixels: refuse images whose header claims more pixels (decompression bombs).
        exif: ``"ignore"`` (default) decodes the stored pixels, as PIL's ``Image.open(f).convert("RGB")`` and
            torchvision's ImageFolder do; ``"apply"`` turns each image by its EXIF orientation first, as
            ``ImageOps.exif_transpose``, and draws crops on the turned size (not for ``--raw`` shards).
        dtype: ``"float32"``, ``"float16"``, ``"bfloat16"`` or ``"uint8"``.
        layout: ``"NCHW"``, ``"NHWC"`` or ``"channels_last"`` (NCHW shape, NHWC memory).
        clock: where to report stage spans (see :class:`Clock`), e.g. a ``StageClock``.
        columns: extra columns of an ingested source (``stallfree ingest`` keeps a file list's further columns);
            when given, each batch is ``(images, labels, {name: tensor for numbers, list otherwise})``.

    Raises:
        ValueError: for bad arguments or an empty dataset, before any work starts.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Reader | torch.utils.data.Dataset[Any],
        batch_size: int,
        *,
        transform: Sequence[Transform] = (),
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device = "cpu",
        placement: Literal["auto", "cpu", "gpu"] = "auto",
        num_threads: int | None = None,
        prefetch: int = 2,
        io_threads: int = 4,
        echo: int = 1,
        echo_mode: Literal["example", "batch"] = "example",
        on_error: Literal["raise", "skip"] = "raise",
        max_pixels: int = DEFAULT_MAX_PIXELS,
        exif: Exif = "ignore",
        dtype: Dtype = "float32",
        layout: Layout = "NCHW",
        clock: Clock | None = None,
        columns: Sequence[str] = (),
    ):
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if num_threads is not None and num_threads <= 0:
            raise ValueError(f"num_threads must be positive, got {num_threads}")
        if prefetch < 1 or io_threads < 1:
            raise ValueError(f"prefetch and io_threads must be >= 1, got prefetch={prefetch}, io_threads={io_threads}")
        if echo_mode not in ("example", "batch"):
            raise ValueError(f"echo_mode must be 'example' or 'batch', got {echo_mode!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if placement not in ("auto", "cpu", "gpu"):
            raise ValueError(f"placement must be 'auto', 'cpu' or 'gpu', got {placement!r}")
        if max_pixels <= 0:
            raise ValueError(f"max_pixels must be positive, got {max_pixels}")
        if exif not in EXIF_MODES:
            raise ValueError(f"exif must be 'ignore' or 'apply', got {exif!r}")
        self.exif: Exif = exif  # decides pixels: part of what a resumed state must match
        self.compiled = CompiledTransforms(transform, dtype=dtype, layout=layout)
        self.device = _device(device)
        if placement == "gpu" and self.device.type != "cuda":
            raise ValueError("placement='gpu' needs a CUDA device=; got device='cpu'")
        on_gpu = placement == "gpu" or (placement == "auto" and self.device.type == "cuda")
        self.reader = open_source(source, exif=exif)
        rank, world_size = _distributed(rank, world_size)
        self.sampler = Sampler(
            len(self.reader),
            rank=rank,
            world_size=world_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            echo=echo if echo_mode == "example" else 1,
        )
        self.batch_size, self.seed, self.drop_last, self.on_error = batch_size, seed, drop_last, on_error
        self.echo, self.echo_mode, self.max_pixels = echo, echo_mode, max_pixels
        self.prefetch, self.io_threads, self.clock = prefetch, io_threads, clock
        self.encoded = bool(getattr(self.reader, "encoded", True))
        self.columns = tuple(columns)
        available = list(getattr(self.reader, "columns", ()))
        if self.columns and not set(self.columns) <= set(available):
            raise ValueError(f"columns={list(self.columns)} but the source has columns {available} (only ingested "
                             "shard folders have extra columns: see `stallfree ingest`)")
        self.labels = self.reader.labels()
        self.num_threads = num_threads or len(os.sched_getaffinity(0))
        self._graph_device = self.device.index if on_gpu else None
        self._graph: Graph | None = None  # built on first iteration, so that construction stays cheap
        self.epoch = 0
        self._resume: tuple[int, int, int] | None = None  # (position, repeat, batches delivered)
        self._delivered = (0, 0, 0)
        self.skipped: list[dict[str, Any]] = []  # this epoch's, so it is also what a resumed Loader carries on
        self._active: _EpochRun | None = None

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        return self.reader.classes

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        per_rank = len(self.sampler)
        batches = per_rank // self.batch_size if self.drop_last else math.ceil(per_rank / self.batch_size)
        return batches * self._batch_echo

    @property
    def _batch_echo(self) -> int:
        """How many times each batch is yielded (``echo`` in batch mode, else 1)."""
        return self.echo if self.echo_mode == "batch" else 1

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation and augmentation next (epochs also advance by themselves after each pass)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self._resume = None
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered to the caller (JSON-serialisable)."""
        position, repeat, delivered = self._delivered if self._resume is None else self._resume
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "position": position,
            "repeat": repeat,
            "batches": delivered,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "rank": self.sampler.rank,
            "world_size": self.sampler.world_size,
            "num_rows": len(self.reader),
            "echo": self.echo,
            "echo_mode": self.echo_mode,
            "skipped": list(self.skipped),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next batch is the one after the last batch delivered when it was taken.

        Raises:
            ValueError: the state belongs to a different dataset size, seed, batch size, echo or rank layout.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown Loader state version {state.get('version')!r} (expected {STATE_VERSION})")
        mine = self.state_dict()
        for key in ("seed", "batch_size", "rank", "world_size", "num_rows", "echo", "echo_mode"):
            if state[key] != mine[key]:
                raise ValueError(f"Loader state has {key}={state[key]!r} but this Loader has {key}={mine[key]!r}")
        self.epoch = int(state["epoch"])
        self._resume = (int(state["position"]), int(state["repeat"]), int(state["batches"]))
        self.skipped = list(state["skipped"])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._active is not None:
            self._active.stop()
        position, repeat, delivered = self._resume or (0, 0, 0)
        if self._resume is None:
            self.skipped = []
        self._resume = None
        self._delivered = (position, repeat, delivered)
        if self._graph is None:
            self._graph = Graph(
                self.compiled,
                batch_size=self.batch_size,
                num_threads=self.num_threads,
                device_id=self._graph_device,
                encoded=self.encoded,
                seed=self.seed,
                exif=self.exif,
            )
        run = _EpochRun(self, self._graph, position, (delivered - repeat) // self._batch_echo)
        self._active = run
        return self._deliver(run, repeat, delivered)

    def _deliver(self, run: _EpochRun, repeat: int, delivered: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        k = self._batch_echo
        try:
            for batch in run:
                self.skipped.extend(batch.skipped)
                if batch.output is None:  # every sample of the batch failed to decode and was skipped
                    self._delivered = (batch.end, 0, delivered)
                    continue
                labels = torch.from_numpy(self.labels[batch.rows]).to(self.device)
                extras = self._extras(batch.rows)
                for r in range(repeat, k):
                    delivered += 1
                    last = r == k - 1
                    self._delivered = (batch.end, 0, delivered) if last else (batch.start, r + 1, delivered)
                    yield (batch.output, labels, extras) if self.columns else (batch.output, labels)  # type: ignore[misc]
                repeat = 0
        finally:
            run.stop()
            if self._active is run:
                self._active = None
        # A complete pass: the next one uses the next epoch's order, whether or not set_epoch() is called.
        self.epoch += 1
        self._delivered = (0, 0, 0)

    def _extras(self, rows: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.columns:
            values = self.reader.column(name, rows)
            numeric = isinstance(values, np.ndarray)
            out[name] = torch.from_numpy(np.ascontiguousarray(values)).to(self.device) if numeric else values
        return out


class _EpochRun:
    """One pass over an epoch from ``position``: the reader and graph threads and their queues."""

    def __init__(self, loader: Loader, graph: Graph, position: int, number: int):
        self.loader, self.graph = loader, graph
        self.order = loader.sampler.virtual_order(loader.epoch)
        self._stop = threading.Event()
        self._read_q: queue.Queue[Any] = queue.Queue(loader.prefetch)
        self._out_q: queue.Queue[Any] = queue.Queue(loader.prefetch)
        self._threads = [
            threading.Thread(target=self._guard, args=(self._read_loop, self._read_q, position, number), daemon=True),
            threading.Thread(target=self._guard, args=(self._graph_loop, self._out_q), daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        _RUNNING.add(self)

    def stop(self) -> None:
        """Stop both threads; a partly consumed epoch can be abandoned at any time."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        """Wait for both threads to end (after :meth:`stop`)."""
        for thread in self._threads:
            thread.join(timeout)

    def _put(self, q: queue.Queue[Any], item: Any) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue[Any]) -> Any:
        while True:
            try:
                return q.get(timeout=0.1)
            except queue.Empty:
                if self._stop.is_set():
                    return _DONE
                continue

    def _guard(self, loop: Any, out: queue.Queue[Any], *args: Any) -> None:
        try:
            loop(*args)
        except BaseException as err:  # noqa: BLE001 - every failure reaches the training loop, none is lost
            self._put(out, _Failure(err))
            return
        self._put(out, _DONE)

    def _record(self, stage: str, state: str, start: float, batch: int) -> None:
        if self.loader.clock is not None:
            self.loader.clock.record(stage, state, start, time.perf_counter(), batch)

    def _read_loop(self, position: int, number: int) -> None:
        loader, order = self.loader, self.order
        per_batch, end_of_epoch = loader.batch_size, len(order)
        with ThreadPoolExecutor(loader.io_threads, thread_name_prefix="stallfree-read") as pool:
            while position < end_of_epoch and not self._stop.is_set():
                if loader.drop_last and end_of_epoch - position < per_batch:
                    break
                start_time = time.perf_counter()
                batch = self._read_batch(pool, number, position, per_batch)
                if batch is None:
                    break
                self._record("read", "busy", start_time, number)
                if not self._put(self._read_q, batch):
                    return
                position, number = batch.end, number + 1

    def _read_batch(self, pool: ThreadPoolExecutor, number: int, position: int, size: int) -> _Batch | None:
        """Read samples from ``position`` until the batch is full; bad ones raise or are skipped and replaced."""
        loader, order = self.loader, self.order
        start = position
        virtual: list[int] = []
        images: list[np.ndarray] = []
        sizes: list[tuple[int, int]] = []
        skipped: list[dict[str, Any]] = []
        while len(virtual) < size and position < len(order):
            chunk = order[position : position + size - len(virtual)]
            position += len(chunk)
            rows = loader.sampler.rows(chunk)
            for v, row, (data, problem) in zip(chunk, rows, pool.map(self._fetch, rows), strict=True):
                if problem is None:
                    try:
                        sizes.append(self._size(data))
                    except BadImage as bad:
                        problem = bad.reason
                if problem is not None:
                    source = loader.reader.describe(int(row))
                    if loader.on_error == "raise":
                        raise BadSampleError(source, int(row), problem)
                    skipped.append({"index": int(row), "source": source, "reason": problem, "epoch": loader.epoch})
                    continue
                virtual.append(int(v))
                images.append(data)
        if not virtual:
            return None
        randoms = batch_random(loader.seed, loader.epoch, virtual)
        params = loader.compiled.draw(randoms, sizes)
        rows = loader.sampler.rows(np.asarray(virtual, np.int64))
        return _Batch(number, start, position, rows, images, params, skipped)

    def _fetch(self, row: int) -> tuple[np.ndarray, str | None]:
        try:
            return self.loader.reader.read(int(row)), None
        except FileNotFoundError:
            return np.empty(0, np.uint8), "missing file"
        except OSError as err:
            return np.empty(0, np.uint8), f"unreadable: {err.strerror or err}"

    def _size(self, data: np.ndarray) -> tuple[int, int]:
        if not self.loader.encoded:
            return int(data.shape[0]), int(data.shape[1])
        header = read_header(data, self.loader.max_pixels, exif=self.loader.exif)
        return header.height, header.width

    def _graph_loop(self) -> None:
        loader = self.loader
        while True:
            item = self._get(self._read_q)
            if isinstance(item, _Failure):  # the reader's failure goes on to the training loop
                self._put(self._out_q, item)
            if not isinstance(item, _Batch):
                return
            start_time = time.perf_counter()
            item.output = self._run_graph(item)
            self._record("augment", "busy", start_time, item.number)
            if item.output is not None and item.output.device != loader.device:
                start_time = time.perf_counter()
                item.output = item.output.pin_memory().to(loader.device, non_blocking=True)
                self._record("h2d", "busy", start_time, item.number)
            if not self._put(self._out_q, item):
                return

    def _run_graph(self, batch: _Batch) -> torch.Tensor | None:
        """Run the graph; if DALI fails, raise naming the sample, or drop the samples that fail alone and rerun."""
        loader = self.loader
        try:
            return self.graph.run(batch.images, batch.params)
        except GraphError as err:
            failure = err
        if not failure.bad or loader.on_error == "raise":
            row = int(batch.rows[failure.bad[0] if failure.bad else 0])
            raise BadSampleError(loader.reader.describe(row), row, f"decoding failed: {failure}") from failure
        for i in failure.bad:
            row = int(batch.rows[i])
            reason = f"decoding failed: {failure}"
            source = loader.reader.describe(row)
            batch.skipped.append({"index": row, "source": source, "reason": reason, "epoch": loader.epoch})
        keep = [i for i in range(len(batch.images)) if i not in set(failure.bad)]
        batch.images = [batch.images[i] for i in keep]
        batch.params = {name: [values[i] for i in keep] for name, values in batch.params.items()}
        batch.rows = batch.rows[keep]
        return self.graph.run(batch.images, batch.params) if keep else None

    def __iter__(self) -> Iterator[_Batch]:
        clock = self.loader.clock
        while True:
            start_time = time.perf_counter()
            item = self._get(self._out_q)
            if clock is not None and isinstance(item, _Batch):
                clock.record("input", "waiting", start_time, time.perf_counter(), item.number)
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
