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
import dataclasses
import hashlib
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

from stallfree.ingest.images import DEFAULT_MAX_PIXELS, EXIF_MODES, BadImage, Exif, read_header
from stallfree.pipeline.graph import Graph, GraphError
from stallfree.pipeline.readers import Reader, open_source
from stallfree.pipeline.sampler import Sampler, process_shard
from stallfree.resume import check_fingerprint
from stallfree.transforms.compile import CompiledTransforms, Dtype, Layout
from stallfree.transforms.random import batch_random
from stallfree.transforms.spec import Transform

__all__ = ["BadSampleError", "Clock", "Loader"]

STATE_VERSION = 2


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


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_arguments(args: dict[str, Any]) -> None:
    """Every Loader argument that is not checked where it is used, each with the fix in its message."""
    if not _is_int(args["batch_size"]) or args["batch_size"] <= 0:
        raise ValueError(f"batch_size must be a positive int, got {args['batch_size']!r}")
    for name in ("shuffle", "drop_last"):
        if not isinstance(args[name], (bool, np.bool_)):
            raise ValueError(f"{name} must be True or False, got {args[name]!r}")
    if not _is_int(args["seed"]):
        raise ValueError(f"seed must be an int, got {args['seed']!r}")
    for name in ("prefetch", "io_threads", "echo"):
        if not _is_int(args[name]) or args[name] < 1:
            raise ValueError(f"{name} must be an int >= 1, got {args[name]!r}")
    if args["num_threads"] is not None and (not _is_int(args["num_threads"]) or args["num_threads"] <= 0):
        raise ValueError(f"num_threads must be positive (or None for the cores this process may use), got "
                         f"{args['num_threads']!r}")
    choices = {"echo_mode": ("example", "batch"), "on_error": ("raise", "skip"), "placement": ("auto", "cpu", "gpu")}
    for name, allowed in choices.items():
        if args[name] not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {args[name]!r}")
    if not _is_int(args["max_pixels"]) or args["max_pixels"] <= 0:
        raise ValueError(f"max_pixels must be a positive int, got {args['max_pixels']!r}")
    columns = args["columns"]
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        example = [columns] if isinstance(columns, str) else ["key"]
        raise ValueError(f"columns must be a list of column names, e.g. columns={example!r}; got {columns!r}")
    clock = args["clock"]
    if clock is not None and not callable(getattr(clock, "record", None)):
        raise ValueError(f"clock must have a record(stage, state, start, end, batch) method (a StageClock has), "
                         f"got {type(clock).__name__}")
    if isinstance(args["transform"], Transform):
        raise ValueError(f"transform must be a list of transforms: transform=[{args['transform']!r}]")


def _source_identity(reader: Reader) -> str:
    """What the source is, independent of where it lies: the reader's ``fingerprint()``, else its kind and labels."""
    fingerprint = getattr(reader, "fingerprint", None)
    if callable(fingerprint):
        return str(fingerprint())
    digest = hashlib.sha256()
    digest.update(f"{type(reader).__qualname__}:{getattr(reader, 'name', '')}:{len(reader)}:".encode())
    digest.update(np.ascontiguousarray(reader.labels(), np.int64).tobytes())
    return digest.hexdigest()


def _describe(steps: Sequence[Transform]) -> str:
    """A stable description of a spec: each step's dataclass repr (its type and every argument)."""
    parts = [repr(s) if dataclasses.is_dataclass(s) else f"{type(s).__module__}.{type(s).__qualname__}" for s in steps]
    return "[" + ", ".join(parts) + "]"


class Loader:
    """Batches of ``(images, labels)`` torch tensors, decoded and augmented in a DALI graph.

    The three-line switch from a DataLoader::

        loader = stallfree.Loader("train/", batch_size=256, device="cuda",
                                  transform=[RandomResizedCrop(224), RandomHorizontalFlip(), Normalize()])
        for images, labels in loader: ...

    One pass at a time: each ``iter(loader)`` is a pass over an epoch. A pass ends when it is exhausted, fails, or
    its iterator is dropped (a ``break``), and when a new ``iter()``, :meth:`set_epoch` or :meth:`load_state_dict`
    starts another; the iterator of an ended pass raises ``RuntimeError`` on ``next`` and changes nothing. The
    next pass then uses the next epoch's order (as ``DataLoader(shuffle=True)`` draws a new one on every pass),
    unless :meth:`set_epoch` or :meth:`load_state_dict` chose where it starts.

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
        rank, world_size: this process's shard; taken from ``torch.distributed`` when it is initialised, else from
            the ``RANK`` and ``WORLD_SIZE`` environment variables (``torchrun`` sets them) when they are set.
        device: ``"cpu"`` or ``"cuda[:N]"``: where the batches are delivered.
        placement: where the graph runs: ``"auto"`` (the GPU when ``device`` is CUDA), ``"cpu"`` or ``"gpu"``.
        num_threads: DALI worker threads (default: the cores this process may use).
        prefetch: batches each stage may run ahead of the training loop.
        io_threads: threads reading files for the reader stage.
        echo: data echoing factor ``k`` (Choi et al.): each sample (``echo_mode="example"``, each repeat freshly
            augmented and spread by the shuffle) or each batch (``"batch"``, yielded ``k`` times) ``k`` times.
        echo_mode: ``"example"`` or ``"batch"``.
        on_error: ``"raise"`` raises :class:`BadSampleError` naming the file; ``"skip"`` lists each skipped sample
            in :attr:`skipped` and fills its place with the next samples of this rank's order (wrapping round to
            its start at the end of the epoch, as ``DistributedSampler`` pads), so that every rank yields
            ``len(loader)`` batches of the sizes an epoch without skips has.
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
        _check_arguments(dict(locals()))
        if exif not in EXIF_MODES:
            raise ValueError(f"exif must be 'ignore' or 'apply', got {exif!r}")
        self.exif: Exif = exif  # decides pixels: part of what a resumed state must match
        self.compiled = CompiledTransforms(transform, dtype=dtype, layout=layout)
        self.device = _device(device)
        if placement == "gpu" and self.device.type != "cuda":
            raise ValueError("placement='gpu' needs a CUDA device=; got device='cpu'")
        on_gpu = placement == "gpu" or (placement == "auto" and self.device.type == "cuda")
        rank, world_size = process_shard(rank, world_size)
        self.reader = open_source(source, exif=exif)
        self.sampler = Sampler(
            len(self.reader),
            rank=rank,
            world_size=world_size,
            shuffle=bool(shuffle),
            seed=int(seed),
            drop_last=bool(drop_last),
            echo=echo if echo_mode == "example" else 1,
        )
        self.batch_size, self.seed, self.drop_last, self.on_error = batch_size, int(seed), bool(drop_last), on_error
        self.echo, self.echo_mode, self.max_pixels = echo, echo_mode, max_pixels
        self.prefetch, self.io_threads, self.clock = prefetch, io_threads, clock
        self.encoded = bool(self.reader.encoded)
        self.columns = tuple(columns)
        available = list(self.reader.columns)
        if self.columns and not set(self.columns) <= set(available):
            raise ValueError(f"columns={list(self.columns)} but the source has columns {available} (only ingested "
                             "shard folders have extra columns: see `stallfree ingest`)")
        self.labels = self.reader.labels()
        self.num_threads = num_threads or len(os.sched_getaffinity(0))
        self._graph_device = self.device.index if on_gpu else None
        self._graph: Graph | None = None  # built on first iteration, so that construction stays cheap
        self._fingerprint: dict[str, Any] | None = None  # computed on the first state_dict (it hashes the source)
        self._epoch = 0  # the epoch of the pass in progress, else of the next pass
        self._start = (0, 0, 0)  # where the next pass starts: (position, repeat, batches delivered)
        self._loaded = False  # whether _start and skipped come from load_state_dict
        self._pass: weakref.ref[_Pass] | None = None
        self.skipped: list[dict[str, Any]] = []  # this epoch's, so it is also what a resumed Loader carries on

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        return self.reader.classes

    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress, or else of the next pass."""
        self._current()
        return self._epoch

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return self._batches_per_epoch * self._batch_echo

    @property
    def _batches_per_epoch(self) -> int:
        per_rank = len(self.sampler)
        return per_rank // self.batch_size if self.drop_last else math.ceil(per_rank / self.batch_size)

    def _batch_len(self, number: int) -> int:
        """Samples in batch ``number`` of an epoch (every batch is full but a last one kept by drop_last=False)."""
        if number < self._batches_per_epoch - 1 or self.drop_last:
            return self.batch_size
        return len(self.sampler) - number * self.batch_size

    @property
    def _batch_echo(self) -> int:
        """How many times each batch is yielded (``echo`` in batch mode, else 1)."""
        return self.echo if self.echo_mode == "batch" else 1

    def _current(self) -> _Pass | None:
        """The pass in progress; once a pass has ended (exhausted, failed, dropped), the next epoch is next."""
        ongoing = self._pass() if self._pass is not None else None
        if ongoing is not None and not ongoing.over:
            return ongoing
        if self._pass is not None:
            self._pass = None
            self._epoch, self._start, self._loaded = self._epoch + 1, (0, 0, 0), False
        return None

    def _end_pass(self, why: str) -> bool:
        """End the pass in progress, if any (its iterator then raises ``why``); whether there was one."""
        ongoing = self._current()
        if ongoing is None:
            return False
        ongoing.end(why)
        self._current()
        return True

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation and augmentation next; it ends a pass in progress.

        Epochs also advance by themselves after each pass. Setting the epoch a loaded state is in keeps its
        position.
        """
        if not _is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        ended = self._end_pass("set_epoch() ended this pass")
        if ended or epoch != self._epoch:
            self._start, self._loaded = (0, 0, 0), False
        self._epoch = int(epoch)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order and the pixels; a state from a Loader whose fingerprint differs is refused."""
        if self._fingerprint is None:
            self._fingerprint = {
                "source": _source_identity(self.reader),
                "num_rows": len(self.reader),
                "shuffle": self.sampler.shuffle,
                "drop_last": self.drop_last,
                "seed": self.seed,
                "batch_size": self.batch_size,
                "echo": self.echo,
                "echo_mode": self.echo_mode,
                "max_pixels": self.max_pixels,
                "exif": self.exif,
                "transform": _describe(self.compiled.steps),
                "dtype": self.compiled.dtype,
                "layout": self.compiled.layout,
                "rank": self.sampler.rank,
                "world_size": self.sampler.world_size,
            }
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered to the caller (JSON-serialisable).

        While a pass is in progress that is where it stands; after a pass has ended it is the start of the next
        epoch (or what :meth:`set_epoch`/:meth:`load_state_dict` chose), which is where ``iter()`` goes on.
        """
        ongoing = self._current()
        position, repeat, delivered = ongoing.cursor if ongoing is not None else self._start
        carried = ongoing is not None or self._loaded
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "position": position,
            "repeat": repeat,
            "batches": delivered,
            "skipped": list(self.skipped) if carried else [],
            "fingerprint": dict(self.fingerprint()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next batch is the one after the last batch delivered when it was taken.

        It ends a pass in progress.

        Raises:
            ValueError: the state comes from a Loader with another fingerprint (source, order, spec, rank layout),
                naming the field that differs.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown Loader state version {state.get('version')!r} (expected {STATE_VERSION}; a "
                             "state from an older stallfree cannot be checked, so start the epoch again)")
        check_fingerprint("Loader", state.get("fingerprint"), self.fingerprint())
        self._end_pass("load_state_dict() ended this pass")
        self._epoch = int(state["epoch"])
        self._start, self._loaded = (int(state["position"]), int(state["repeat"]), int(state["batches"])), True
        self.skipped = list(state["skipped"])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._end_pass("a newer iter() started a new pass over the Loader")
        position, repeat, delivered = self._start
        if not self._loaded:
            self.skipped = []
        self._start, self._loaded = (0, 0, 0), False  # what it becomes once this pass ends
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
        run = _EpochRun(self, self._graph, self._epoch, position, (delivered - repeat) // self._batch_echo)
        ongoing = _Pass(self, run, (position, repeat, delivered))
        self._pass = weakref.ref(ongoing)
        return ongoing

    def _extras(self, rows: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.columns:
            values = self.reader.column(name, rows)
            numeric = isinstance(values, np.ndarray)
            out[name] = torch.from_numpy(np.ascontiguousarray(values)).to(self.device) if numeric else values
        return out


class _Pass:
    """The iterator of one pass: batches from an :class:`_EpochRun`, each yielded ``echo`` times in batch mode."""

    def __init__(self, loader: Loader, run: _EpochRun, cursor: tuple[int, int, int]):
        self.loader, self.run = loader, run
        self.cursor = cursor  # after the last batch delivered: (position, repeat, batches delivered)
        self.over = False
        self._why: str | None = None
        self._batches = iter(run)
        self._batch: tuple[_Batch, Any] | None = None
        self._repeat = cursor[1]
        weakref.finalize(self, run.stop)  # a dropped iterator stops its threads

    def end(self, why: str) -> None:
        """End this pass from outside: its threads stop and its next ``next`` raises."""
        self.over, self._why = True, why
        self.run.stop()

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> Any:
        if self._why is not None:
            raise RuntimeError(f"this Loader iterator's pass is over: {self._why}; iterate the Loader again "
                               "(`for batch in loader`) to go on")
        if self.over:
            raise StopIteration
        loader, k = self.loader, self.loader._batch_echo
        if self._batch is None or self._repeat == k:
            try:
                batch = next(self._batches)
            except BaseException:  # exhausted or failed: either way this pass is over
                self.over = True
                self.run.stop()
                raise
            loader.skipped.extend(batch.skipped)
            labels = torch.from_numpy(loader.labels[batch.rows]).to(loader.device)
            out = (batch.output, labels, loader._extras(batch.rows)) if loader.columns else (batch.output, labels)
            self._repeat = self._repeat if self._batch is None else 0
            self._batch = batch, out
        batch, out = self._batch
        r, self._repeat = self._repeat, self._repeat + 1
        delivered = self.cursor[2] + 1
        self.cursor = (batch.end, 0, delivered) if r == k - 1 else (batch.start, r + 1, delivered)
        return out


@dataclass
class _Chunk:
    """Consecutive positions of a rank's stream as the reader found them, in order.

    ``entries`` holds ``(position, virtual id, image, params)`` for a sample that passed the host checks and
    ``(position, None, record, None)`` for one that failed them (``record`` is ``None`` when it is known bad).
    """

    entries: list[tuple[int, int | None, Any, Any]]


class _EpochRun:
    """One pass over an epoch from ``position``: the reader and graph threads and their queues.

    The rank's stream is its epoch order, wrapping round: position ``p`` is sample ``order[p % len(order)]``. The
    reader reads the stream ahead; the graph stage takes from it, in order, the samples of each batch, and
    replaces every sample that fails (on the host or in the graph) by the next ones, so each batch is full and
    the epoch has ``len(loader)`` batches whatever is skipped. A position keeps its outcome for the epoch: a
    skipped sample met again after the wrap is passed over without being read or listed again.
    """

    def __init__(self, loader: Loader, graph: Graph, epoch: int, position: int, number: int):
        self.loader, self.graph, self.epoch = loader, graph, epoch
        self.order = loader.sampler.virtual_order(epoch)
        self.bad = {int(s["position"]) % len(self.order) for s in loader.skipped}  # this epoch's skipped positions
        self.first_skip: dict[str, Any] | None = loader.skipped[0] if loader.skipped else None
        self._stop = threading.Event()
        self._read_q: queue.Queue[Any] = queue.Queue(loader.prefetch)
        self._out_q: queue.Queue[Any] = queue.Queue(loader.prefetch)
        self._more: queue.Queue[int] = queue.Queue()  # samples the graph stage rejected, for the reader to replace
        self._pending: list[tuple[int, int | None, Any, Any]] = []
        self._cursor = position
        self._threads = [
            threading.Thread(target=self._guard, args=(self._read_loop, self._read_q, position, number), daemon=True),
            threading.Thread(target=self._guard, args=(self._graph_loop, self._out_q, number), daemon=True),
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

    def _skip(self, position: int, row: int, reason: str) -> dict[str, Any]:
        source = self.loader.reader.describe(row)
        if self.loader.on_error == "raise":
            raise BadSampleError(source, row, reason)
        return {"index": row, "source": source, "reason": reason, "epoch": self.epoch, "position": position}

    def _read_loop(self, position: int, number: int) -> None:
        """Read the stream: a chunk of good samples per remaining batch, then one per sample the graph rejects."""
        loader = self.loader
        plan = [loader._batch_len(b) for b in range(number, loader._batches_per_epoch)]
        known_bad = set(self.bad)  # the reader's own view: what it skipped, and what the state carried
        with ThreadPoolExecutor(loader.io_threads, thread_name_prefix="stallfree-read") as pool:
            while not self._stop.is_set():
                if plan:
                    wanted = plan.pop(0)
                else:
                    try:
                        wanted = self._more.get(timeout=0.1)
                    except queue.Empty:
                        continue
                start_time = time.perf_counter()
                chunk, position = self._read_chunk(pool, position, wanted, known_bad)
                self._record("read", "busy", start_time, number)
                if not self._put(self._read_q, chunk):
                    return
                number += 1

    def _read_chunk(self, pool: ThreadPoolExecutor, position: int, wanted: int,
                    known_bad: set[int]) -> tuple[_Chunk, int]:
        """Read from ``position`` until ``wanted`` samples pass the host checks (header, size)."""
        loader, order, n = self.loader, self.order, len(self.order)
        entries: list[tuple[int, int | None, Any, Any]] = []
        good: list[int] = []
        images: list[np.ndarray] = []
        sizes: list[tuple[int, int]] = []
        if len(known_bad) >= n:
            return _Chunk(entries), position  # nothing left to read; the graph stage reports it
        while len(good) < wanted:
            span = np.arange(position, position + wanted - len(good))
            position += len(span)
            keep = [int(p) for p in span if int(p) % n not in known_bad] if known_bad else span.tolist()
            if known_bad:
                entries.extend((int(p), None, None, None) for p in span if int(p) % n in known_bad)
            rows = loader.sampler.rows(order[np.asarray(keep, np.int64) % n]).tolist()
            for p, row, (data, problem) in zip(keep, rows, pool.map(self._fetch, rows), strict=True):
                if problem is None:
                    try:
                        sizes.append(self._size(data))
                    except BadImage as bad:
                        problem = bad.reason
                if problem is not None:
                    known_bad.add(p % n)
                    entries.append((p, None, self._skip(p, int(row), problem), None))
                    continue
                good.append(p)
                images.append(data)
            if len(known_bad) >= n:
                break
        if good:
            virtual = order[np.asarray(good, np.int64) % n]
            params = loader.compiled.draw(batch_random(loader.seed, self.epoch, virtual.tolist()), sizes)
            names = list(params)
            for i, p in enumerate(good):
                entries.append((p, int(virtual[i]), images[i], tuple(params[name][i] for name in names)))
        entries.sort(key=lambda entry: entry[0])
        return _Chunk(entries), position

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

    def _graph_loop(self, first: int) -> None:
        loader = self.loader
        for number in range(first, loader._batches_per_epoch):
            batch = self._assemble(number, loader._batch_len(number))
            if batch is None:
                return
            if batch.output is not None and batch.output.device != loader.device:
                start_time = time.perf_counter()
                batch.output = batch.output.pin_memory().to(loader.device, non_blocking=True)
                self._record("h2d", "busy", start_time, number)
            if not self._put(self._out_q, batch):
                return

    def _entry(self) -> tuple[int, int | None, Any, Any] | None:
        """The next entry of the stream (``None`` once stopped); a reader failure is raised here."""
        while not self._pending:
            item = self._get(self._read_q)
            if isinstance(item, _Failure):
                raise item.error
            if item is _DONE:
                return None
            self._pending = item.entries[::-1]
        return self._pending.pop()

    def _note_skip(self, record: dict[str, Any], skipped: list[dict[str, Any]]) -> None:
        self.bad.add(int(record["position"]) % len(self.order))
        skipped.append(record)
        self.first_skip = self.first_skip or record
        self._check_left()

    def _check_left(self) -> None:
        """Raise once every position of the epoch is skipped: no sample is left to fill a batch with."""
        first = self.first_skip
        if len(self.bad) >= len(self.order) and first is not None:
            raise RuntimeError(
                f"every sample of this rank's epoch was skipped ({len(self.order)} samples; the first: "
                f"{first['source']}: {first['reason']}); check the data, or the transforms if every sample fails "
                "in the graph"
            )

    def _assemble(self, number: int, size: int) -> _Batch | None:
        """Batch ``number``: the next ``size`` good samples of the stream, through the graph."""
        loader, start, n = self.loader, self._cursor, len(self.order)
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
                elif position % n in self.bad:  # failed in the graph earlier this epoch: replace it
                    self._more.put(1)
                else:
                    taken.append((position, virtual, payload, params))
            images = [t[2] for t in taken]
            params = {name: [t[3][j] for t in taken] for j, name in enumerate(names)}
            rows = loader.sampler.rows(np.asarray([t[1] for t in taken], np.int64))
            start_time = time.perf_counter()  # the graph's busy span, not the wait for the reader's samples
            try:
                output = self.graph.run(images, params)
                self._record("augment", "busy", start_time, number)
            except GraphError as failure:
                self._record("augment", "busy", start_time, number)
                if not failure.bad or loader.on_error == "raise":
                    row = int(rows[failure.bad[0] if failure.bad else 0])
                    reason = failure.reasons[0] if failure.bad else str(failure)
                    raise BadSampleError(loader.reader.describe(row), row, f"decoding failed: {reason}") from failure
                for i, reason in zip(failure.bad, failure.reasons, strict=True):
                    self._note_skip(self._skip(taken[i][0], int(rows[i]), f"decoding failed: {reason}"), skipped)
                bad = set(failure.bad)
                taken = [t for i, t in enumerate(taken) if i not in bad]
                self._more.put(len(bad))
                continue
            return _Batch(number, start, self._cursor, rows, images, params, skipped, output)

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
