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

import contextlib
import copy
import dataclasses
import os
import warnings
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

import torch

from stallfree.ingest.images import DEFAULT_MAX_PIXELS, EXIF_MODES, Exif
from stallfree.ingest.remote import is_url
from stallfree.pipeline.arguments import (
    BUILTIN_COLUMNS,
    check_arguments,
    check_dataloader_keywords,
    device_of,
    dtype_name,
    is_int,
    loader_fingerprint,
    remote_keywords,
)
from stallfree.pipeline.assembly import ImageAssembly
from stallfree.pipeline.batcher import CountBatcher, Cursor
from stallfree.pipeline.block_order import block_order
from stallfree.pipeline.epoch import EpochRun
from stallfree.pipeline.graph import Graph
from stallfree.pipeline.lifecycle import copied, forked
from stallfree.pipeline.loader_sampler import LoaderSampler, Orders
from stallfree.pipeline.loader_state import LoaderState, read_state
from stallfree.pipeline.next_pass import NextPass
from stallfree.pipeline.passes import Pass, Progress
from stallfree.pipeline.process_group import UnknownRank, cache_rank
from stallfree.pipeline.ray_run import RayRun
from stallfree.pipeline.ray_transfer import worker_spec
from stallfree.pipeline.ray_workers import RayWorkers, run_key
from stallfree.pipeline.reader_base import BaseReader, Reader
from stallfree.pipeline.readers import open_source, unwrap_torchvision_dataset
from stallfree.pipeline.run import Run
from stallfree.pipeline.run_config import RunConfig, RunParts
from stallfree.pipeline.samples import BadSampleError
from stallfree.pipeline.shards import Verify
from stallfree.pipeline.webdataset import is_webdataset
from stallfree.transforms.compile import CompiledTransforms, Dtype, Layout
from stallfree.transforms.translation.translator import to_steps

__all__ = ["BadSampleError", "Clock", "Loader"]

STATE_VERSION = 4  # 4: the stages' parts nested (sampler, batcher), the reader's rejections


class Clock(Protocol):
    """Where the Loader reports its spans (``stallfree.stage_runtime.clock.StageClock`` is one)."""

    def record(self, stage: str, state: str, start: float, end: float, batch: int | None = None) -> None:
        """Record that ``stage`` was ``state`` ("busy" or "waiting") from ``start`` to ``end`` (perf_counter)."""


def _pin_memory(pin_memory: bool, device: torch.device) -> bool:
    """Whether CPU batches are pinned: DataLoader's rule, refused for a GPU device, a warning without CUDA."""
    if pin_memory and device.type != "cpu":
        raise ValueError(f"pin_memory=True pins CPU batches, but device={str(device)!r} delivers them on the "
                         "GPU already; drop pin_memory, or use device='cpu' to copy them yourself")
    if pin_memory and not torch.cuda.is_available():
        warnings.warn("pin_memory=True but torch sees no CUDA device: batches stay in ordinary memory (as "
                      "DataLoader does)", UserWarning, stacklevel=3)
        return False
    return bool(pin_memory)


def _open(source: Any, *, exif: Exif, verify: Verify, rank: int, on_error: str, remote: dict[str, Any]) -> BaseReader:
    """The source's reader, with the remote keywords checked (refused for a local source that is not tars)."""
    webdataset = is_webdataset(source)
    keywords = remote_keywords(remote, source=source, on_error=on_error, remote=is_url(source), webdataset=webdataset)
    if keywords and not webdataset:
        keywords["rank"] = rank  # the default shard cache is one folder per rank
    return open_source(source, exif=exif, verify=verify, remote=keywords or None)


def _check_workers(workers: Any, placement: str) -> RayWorkers | None:
    """``workers=``: ``None`` or a :class:`RayWorkers`, whose actors run DALI's CPU operators."""
    if workers is None:
        return None
    if not isinstance(workers, RayWorkers):
        raise TypeError(f"workers must be None or stallfree.RayWorkers(...), got {workers!r}")
    if placement == "gpu":
        raise ValueError("placement='gpu' with workers=RayWorkers(...): Ray workers run DALI's CPU operators; "
                         "use placement='auto' (batches are still delivered on device=)")
    return workers


def _check_exists(source: Any) -> None:
    """A local path that does not exist, as a FileNotFoundError naming it (URLs and tar patterns are opened later)."""
    if isinstance(source, (str, os.PathLike)) and not is_url(source) and not is_webdataset(source):
        if not os.path.exists(source):
            raise FileNotFoundError(f"dataset {os.fspath(source)} does not exist")


def _columns(reader: BaseReader, columns: Sequence[str]) -> tuple[str, ...]:
    """``columns=``, each one the source has (its own columns, or the built-in ones), or a ValueError naming them."""
    available = list(reader.columns) + [c for c in BUILTIN_COLUMNS if c not in reader.columns]
    if columns and not set(columns) <= set(available):
        raise ValueError(f"columns={list(columns)} but the source has columns {available} (only ingested "
                         "shard folders have further columns: see `stallfree ingest`)")
    return tuple(columns)


class Loader:
    """Batches of ``(images, labels)`` torch tensors, decoded and augmented in a DALI graph.

    One pass at a time: each ``iter(loader)`` is a pass over an epoch. A pass ends when it is exhausted, fails, or
    its iterator is dropped (a ``break``), and when a new ``iter()``, :meth:`set_epoch` or :meth:`load_state_dict`
    starts another; the iterator of an ended pass raises ``RuntimeError`` on ``next`` and changes nothing. The
    next pass then uses the next epoch's order (as ``DataLoader(shuffle=True)`` draws a new one on every pass),
    unless :meth:`set_epoch` or :meth:`load_state_dict` chose where it starts.

    Args:
        source: an ImageFolder tree, a CSV or Parquet file list (``path``, ``label``), an ingested shard folder
            (or its URL: ``s3://``, ``gs://``, ``https://``, ``file://``; docs/remote.md), WebDataset tars read in
            place (a path or URL ending in ``.tar`` or with ``{first..last}`` ranges; docs/remote.md), a map-style torch
            ``Dataset`` of ``(image, label)`` items (see :class:`DatasetReader`), or a :class:`Reader`. A
            torchvision dataset (``ImageFolder(root, transform=...)``) brings its transforms (see
            :func:`~stallfree.pipeline.readers.unwrap_torchvision_dataset`), so ``DataLoader(dataset, ...)``
            becomes ``Loader(dataset, ...)``.
        batch_size: samples per batch.
        transform: the augmentation spec: a ``stallfree.transforms`` step, a list or a ``Compose`` of them, or
            torchvision's own transforms (``T.Compose``, ``v2.Compose``, one transform, a list), translated with
            their parameters (``stallfree.transforms.from_torchvision``). It must end at a fixed size.
        shuffle: ``True``/``"global"``: a global permutation per ``(seed, epoch)``; ``"block"``: shards ``block_shards``
            at a time (a bounded working set for a small remote cache; docs/remote.md); ``False`` (the default, as
            DataLoader's): row order.
        block_shards: shards per block of ``shuffle="block"``.
        seed: seeds the order and every random augmentation parameter; the same on every rank.
        drop_last: as ``DistributedSampler(drop_last=True)`` plus ``DataLoader(drop_last=True)``: truncate so
            every rank has the same number of samples, and drop the last incomplete batch. Without it, ranks are
            padded to the same count with samples from the start of the permutation (so a few samples appear
            twice in an epoch when the dataset does not divide by ``world_size``), and the last batch may be short.
        rank, world_size: this process's shard, decided when each pass starts (so that a Loader built at the top
            of a Lightning DDP script follows the group ``fit`` makes): each one given wins, else
            ``torch.distributed``'s group, else ``RANK``/``WORLD_SIZE`` (torchrun) or Lightning's ``LOCAL_RANK``/
            ``NODE_RANK`` (:mod:`~stallfree.pipeline.process_group`). Under DDP it shards as ``DistributedSampler``
            does, each sample once over the job; ``rank=0, world_size=1`` gives every rank every sample.
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
        verify: when an ingested shard's SHA-256 is checked against the manifest: ``"first-use"`` (on its first
            read), ``"open"`` (every shard at construction) or ``"none"``. A shard that matched once is not hashed
            again while unchanged (``stallfree.pipeline.verified``). Other sources carry no checksums.
        max_pixels: refuse images whose header claims more pixels (decompression bombs).
        exif: ``"ignore"`` (default) decodes the stored pixels, as PIL's ``Image.open(f).convert("RGB")`` and
            torchvision's ImageFolder do; ``"apply"`` turns each image by its EXIF orientation first, as
            ``ImageOps.exif_transpose``, and draws crops on the turned size (not for ``--raw`` shards).
        dtype: ``"float32"``, ``"float16"``, ``"bfloat16"`` or ``"uint8"``, or that ``torch.dtype``. Default:
            what a translated torchvision pipeline ends with (uint8 after ``PILToTensor``), else float32.
        layout: ``"NCHW"``, ``"NHWC"`` or ``"channels_last"`` (NCHW shape, NHWC memory).
        channels: 3 (RGB) or 1 (grayscale: PIL's ``convert("L")`` luma, as a ``Grayscale(1)`` step first, after a
            leading ``RandomResizedCrop`` so that its window is still all that is decoded).
        clock: where to report stage spans (see :class:`Clock`), e.g. a ``StageClock``.
        columns: extra fields with each batch: ``"index"`` (the sample's row in the source) and ``"path"`` (its
            file, or the shard row or dataset item) for every source, and an ingested source's own columns
            (``stallfree ingest`` keeps a file list's further columns); when given, each batch is
            ``(images, labels, {name: tensor for numbers, list otherwise})``.
        pin_memory: as DataLoader's: CPU batches (images and labels) in page-locked memory, for a fast
            ``.to("cuda", non_blocking=True)``. Without a CUDA device it warns and does nothing, as DataLoader does.
        target_transform: as ImageFolder's: called on each label (an int); the batch's results are collated as
            DataLoader's ``default_collate`` does (numbers become a tensor).
        cache_dir, cache_limit, storage_options, downloads, read_ahead, retries, remote_timeout: for a source at a
            URL only (docs/remote.md): the local shard cache (default ``~/.cache/stallfree/shards``) and its size
            in bytes (default: no limit), the fsspec store's options (credentials, ``endpoint_url``), concurrent
            downloads (8), bytes fetched ahead of the reads (default 3/4 of the cache, or 1 GiB), tries per download
            (5) and seconds without a byte before a try fails (60); ``remote_min_rate``, ``remote_rate_window``: a
            try also fails once it has received under that many bytes a second over that many seconds (1024, 30; 0
            turns it off). WebDataset tars take ``cache_dir`` (where their
            indexes are kept, default ``~/.cache/stallfree/webdataset-index``) and, at a URL, ``storage_options``,
            ``downloads`` (ranged requests in flight, default 64), ``read_ahead`` (bytes of coming samples held in
            memory, default 64 MiB), ``retries``, the three stall keywords, and ``cache_limit`` (tars read whole
            from a server that ignores Range).
        workers: where the graph runs: ``None`` (this process) or :class:`RayWorkers` (``num_workers`` Ray actors
            on CPU machines, docs/ray.md): the same batches, skips and resume states as here with
            ``placement="cpu"``; a state moves between the two (where the work runs is not in the fingerprint).

    DataLoader's other keywords (``num_workers``, ``persistent_workers``, ``collate_fn``, ``sampler``, ...) are
    refused with a ``TypeError`` that says what the Loader does instead.

    Raises:
        ValueError: for bad arguments or an empty dataset, before any work starts.
        TypeError: a keyword the Loader does not take, or a transform that cannot run in the graph (named).
    """

    #: As DataLoader's attribute for tools that read it (Lightning): batches are cut from the sampler's order in
    #: the graph, not by a batch sampler.
    batch_sampler: None = None

    def __init__(
        self,
        source: str | os.PathLike[str] | Reader | torch.utils.data.Dataset[Any],
        batch_size: int,
        *,
        transform: Any = (),
        shuffle: bool | Literal["global", "block"] = False,
        block_shards: int = 8,
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
        verify: Verify = "first-use",
        max_pixels: int = DEFAULT_MAX_PIXELS,
        exif: Exif = "ignore",
        dtype: Dtype | torch.dtype | None = None,
        layout: Layout = "NCHW",
        channels: int = 3,
        clock: Clock | None = None,
        columns: Sequence[str] = (),
        pin_memory: bool = False,
        target_transform: Any = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        storage_options: dict[str, Any] | None = None,
        downloads: int | None = None,
        read_ahead: int | None = None,
        retries: int = 5,
        remote_timeout: float = 60.0,
        remote_min_rate: float = 1024.0, remote_rate_window: float = 30.0,  # a trickle: under 1 KiB/s over 30 s
        workers: RayWorkers | None = None,
        **dataloader_keywords: Any,
    ):
        check_dataloader_keywords(dataloader_keywords)
        self.dataset = source  # the source as given, as DataLoader's `.dataset` (before a torchvision one is unwrapped)
        source, transform, target_transform = unwrap_torchvision_dataset(source, transform, target_transform)
        check_arguments(batch_size=batch_size, drop_last=drop_last, shuffle=shuffle, block_shards=block_shards,
                        seed=seed, prefetch=prefetch, io_threads=io_threads, echo=echo, num_threads=num_threads,
                        echo_mode=echo_mode, on_error=on_error, placement=placement, verify=verify,
                        max_pixels=max_pixels, columns=columns, pin_memory=pin_memory,
                        target_transform=target_transform, clock=clock)
        _check_exists(source)  # a wrong path before the transform's checks, which would hide it
        if exif not in EXIF_MODES:
            raise ValueError(f"exif must be 'ignore' or 'apply', got {exif!r}")
        self.exif: Exif = exif  # decides pixels: part of what a resumed state must match
        spec = to_steps(transform)
        out_dtype = dtype_name(dtype) if dtype is not None else (spec.dtype or "float32")
        self.compiled = CompiledTransforms(spec.steps, dtype=out_dtype, layout=layout, channels=channels)
        self.device = device_of(device)
        self.pin_memory, self.target_transform = _pin_memory(pin_memory, self.device), target_transform
        if placement == "gpu" and self.device.type != "cuda":
            raise ValueError("placement='gpu' needs a CUDA device=; got device='cpu'")
        on_gpu = placement == "gpu" or (placement == "auto" and self.device.type == "cuda")
        self.workers = _check_workers(workers, placement)
        on_gpu = on_gpu and workers is None  # Ray workers run DALI's CPU operators; the batch then goes to device
        remote_options = {"cache_dir": cache_dir, "cache_limit": cache_limit, "storage_options": storage_options,
                          "downloads": downloads, "read_ahead": read_ahead, "retries": retries,
                          "remote_timeout": remote_timeout, "remote_min_rate": remote_min_rate,
                          "remote_rate_window": remote_rate_window}
        self.reader = _open(source, exif=exif, verify=verify, rank=cache_rank(rank, world_size), on_error=on_error,
                            remote=remote_options)
        self.shuffle_mode = "block" if shuffle == "block" else ("global" if shuffle else "none")
        self.block_shards = int(block_shards)
        self.batch_size, self.seed, self.drop_last, self.on_error = batch_size, int(seed), bool(drop_last), on_error
        self.echo, self.echo_mode, self.max_pixels = echo, echo_mode, max_pixels
        self.batcher = CountBatcher(batch_size, self.drop_last, echo if echo_mode == "batch" else 1)
        echo_k = echo if echo_mode == "example" else 1  # the sampler's; batch echo repeats batches instead
        permute = block_order(self.reader, self.block_shards, self.seed, echo_k) if shuffle == "block" else None
        self._orders = Orders(self, rank, world_size, num_rows=len(self.reader), shuffle=self.shuffle_mode != "none",
                              seed=self.seed, drop_last=self.drop_last, echo=echo_k, permute=permute)
        self.prefetch, self.io_threads, self.clock = prefetch, io_threads, clock
        self.encoded = bool(self.reader.encoded)
        self.columns = _columns(self.reader, columns)
        self.labels = self.reader.labels()
        self.num_threads = num_threads or len(os.sched_getaffinity(0))
        self._graph_device = self.device.index if on_gpu else None
        self._ray_id = run_key() if workers is not None else ""  # names this Loader's setup on the actors
        self._worker_spec = worker_spec(self.compiled, workers.transfer) if workers is not None else None
        self._fingerprint: dict[str, Any] | None = None  # computed on the first state_dict (it hashes the source)
        self._epoch = 0  # the epoch of the pass in progress, else of the next pass
        self._start = Cursor()  # where the next pass starts
        self._split = 0  # the global position this epoch's split over ranks starts at (elastic resume; else 0)
        self._loaded = False  # whether _start and skipped come from load_state_dict
        self._loaded_raw: Any = None  # that state, read again if a pass starts on another shard than it was read for
        self._fixed = (0, 0)  # the (rank, world_size) of the pass in progress, else of the loaded state
        self._local()
        self.skipped: list[dict[str, Any]] = []  # this epoch's, so it is also what a resumed Loader carries on
        with contextlib.suppress(UnknownRank):  # where a rank is known only once the process group is: at the pass
            self.sampler  # noqa: B018 - an empty dataset, or drop_last over more ranks than samples, refused now

    def _local(self) -> None:
        """What belongs to this process alone, made anew in a copy (pickle, deepcopy, a forked child; lifecycle)."""
        self._graph: Graph | None = None  # built on first iteration, so that construction stays cheap
        self._pass: weakref.ref[Pass] | None = None
        self._progress = Progress()  # whether the pass, even once dropped, delivered a batch
        self._next = NextPass()  # the next epoch's run, started once this pass's reader has read its epoch
        self._discard = weakref.finalize(self, self._next.discard)
        self._pid = os.getpid()

    @property
    def sampler(self) -> LoaderSampler:
        """The order of the pass in progress, else of a loaded state, else of this rank now (:class:`Orders`).

        ``loader.sampler.set_epoch`` is :meth:`set_epoch` (Lightning's fit loop calls it).
        """
        return self._orders[self._shard()]

    def _shard(self) -> tuple[int, int]:
        """``(rank, world_size)`` of the pass in progress, else of a loaded state, else of the process now."""
        return self._fixed if self._current() is not None or self._loaded else self._orders.now()

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
        """Batches this rank yields per epoch (a pass resumed elastically yields only the epoch's remainder)."""
        return self.batcher.deliveries(len(self.sampler))

    def _config(self) -> RunConfig:
        """The settings an epoch run reads, as they are now."""
        return RunConfig(batcher=self.batcher, seed=self.seed, prefetch=self.prefetch,
                         io_threads=self.io_threads, on_error=self.on_error, max_pixels=self.max_pixels,
                         exif=self.exif, encoded=self.encoded, device=self.device)

    def _parts(self, shard: tuple[int, int] | None = None) -> RunParts:
        """What a run on ``shard`` (else :attr:`sampler`'s) is made of: settings and clock as they are now."""
        return RunParts(self._config(), self._orders[shard or self._shard()].order(), self.reader, self.compiled,
                        self.clock)

    def _current(self) -> Pass | None:
        """The pass in progress; once a pass has ended (exhausted, failed, dropped), the next epoch is next.

        Not after a pass ended before its first ``next`` (Lightning's ``iter()`` that checks a dataloader is iterable).
        """
        ongoing = self._pass() if self._pass is not None else None
        if (ongoing is None or ongoing.over) and self._pass is not None:
            ongoing, self._pass = None, None
            if self._progress.taken:
                self._epoch, self._start, self._loaded, self._split = self._epoch + 1, Cursor(), False, 0
        if self._pid != os.getpid():  # a forked child's copy: the parent's pass stays the parent's (lifecycle)
            forked(self, ongoing)
            return None
        return ongoing

    def _start_next(self, ended: Pass) -> None:
        """``ended``'s run has read its epoch: start the next epoch's run, which ``iter()`` then takes."""
        if self._graph is not None and self._current() is ended:
            self._next.start(self._parts(self._fixed), self._graph, self._epoch + 1)

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
        position. Between ``iter()`` and the first batch of a pass (where Lightning's fit loop calls it) it chooses
        that pass's epoch instead, as a DataLoader's order is drawn on the first ``next``: the same epoch keeps the
        pass as it is, another restarts it at that epoch's start.
        """
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        ongoing = self._current()
        if ongoing is not None and ongoing.fresh:
            if epoch != self._epoch:
                self._epoch, self._split, self._start, self._loaded = int(epoch), 0, Cursor(), False
                self.skipped.clear()  # the list the pass adds to
                ongoing.restart(*self._run(Cursor()))
            return
        ended = self._end_pass("set_epoch() ended this pass")
        if ended or epoch != self._epoch:
            self._start, self._loaded, self._split = Cursor(), False, 0
        self._epoch = int(epoch)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order and pixels (with the world size, not the rank); a state of another is refused."""
        return self._fingerprint_of(self._shard()[1])

    def _fingerprint_of(self, world_size: int) -> dict[str, Any]:
        if self._fingerprint is None:  # it hashes the source: once
            self._fingerprint = loader_fingerprint(self)
        return {**self._fingerprint, "world_size": world_size}

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered to the caller (JSON-serialisable).

        While a pass is in progress that is where it stands; after a pass has ended it is the start of the next
        epoch (or what :meth:`set_epoch`/:meth:`load_state_dict` chose), which is where ``iter()`` goes on.
        """
        ongoing = self._current()
        return self._state_at(ongoing.cursor if ongoing is not None else self._start, ongoing is not None)

    def _state_at(self, cursor: Cursor, in_pass: bool) -> dict[str, Any]:
        """The state of this Loader standing at ``cursor`` (``in_pass``: the pass's; else the next pass's start).

        Each stage's part nests under its name (:mod:`stallfree.pipeline.loader_state`).
        """
        rank, world_size = self._fixed if in_pass or self._loaded else self._orders.now()
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "rank": rank,  # where it was taken: another rank's state loads too (load_state_dict)
            "fingerprint": self._fingerprint_of(world_size),
            "sampler": {"split": self._split},
            "batcher": self.batcher.state_dict(cursor),
            "skipped": list(self.skipped) if in_pass or self._loaded else [],
            "rejected": [dict(record) for record in self.reader.rejected],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next batch is the one after the last batch delivered when it was taken.

        It ends a pass in progress. Any rank's state loads: from the same ``world_size`` this rank goes on after its
        own batches (:mod:`stallfree.pipeline.loader_state`), from another elastically (:mod:`.elastic`). It is read
        for the process's rank now, and again if a pass starts on another (a process group made after it).

        Raises:
            ValueError: the state comes from a Loader with another fingerprint (source, order, spec),
                naming the field that differs; or it is not a state this Loader could have taken (a field
                missing, of another type, out of range, or disagreeing with the others: named with its value,
                :mod:`stallfree.pipeline.loader_state`); or another world size's state has skipped samples or
                stands between the repeats of an echoed batch. A refused state changes nothing.
        """
        shard = self._orders.now()
        loaded = self._read(state, shard)
        self._end_pass("load_state_dict() ended this pass")
        self._take(loaded, shard, copy.deepcopy(state))

    def _read(self, state: object, shard: tuple[int, int]) -> LoaderState:
        """``state`` checked against this Loader on ``shard`` (:func:`read_state`)."""
        return read_state(state, version=STATE_VERSION, fingerprint=self._fingerprint_of(shard[1]),
                          sampler=self._orders[shard], batcher=self.batcher, on_error=self.on_error)

    def _take(self, loaded: LoaderState, shard: tuple[int, int], state: Any) -> None:
        """Stand where ``loaded`` says, on ``shard``."""
        self._epoch, self._split, self._loaded, self._fixed = loaded.epoch, loaded.split, True, shard
        self._start, self.skipped, self._loaded_raw = loaded.start, loaded.skipped, state

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._end_pass("a newer iter() started a new pass over the Loader")
        shard = self._orders.now()  # the rank is decided now, as a DistributedSampler made in fit
        if self._loaded and shard != self._fixed:  # the process group came after load_state_dict
            self._take(self._read(self._loaded_raw, shard), shard, self._loaded_raw)
        self._fixed = shard
        if not self._loaded:
            self.skipped = []
        run, cursor = self._run(self._start)
        assemble = ImageAssembly(self.labels, self.reader, self.device, self.pin_memory, self.target_transform,
                                 self.columns)
        self._progress = Progress()
        ongoing = Pass(run, cursor, batcher=self.batcher, assemble=assemble, skipped=self.skipped,
                       start_next=self._start_next, progress=self._progress)
        self._pass = weakref.ref(ongoing)
        return ongoing

    def _run(self, cursor: Cursor) -> tuple[Run, Cursor]:
        """The epoch run of the current epoch from ``cursor`` (the one started ahead if it fits), and the cursor."""
        position, number = cursor.position, self.batcher.number(cursor)
        if self.workers is not None:
            return self._ray_run(self.workers, position, number), cursor
        parts, graph = self._parts(self._fixed), self._built_graph()
        run = self._next.take(self._epoch, self._split, position, number, self.skipped, parts) or EpochRun(
            parts, graph, self._epoch, self._split, position, number, self.skipped)
        return run, cursor

    def _built_graph(self) -> Graph:
        """The DALI graph every run of this Loader shares, built on first use."""
        if self._graph is None:
            self._graph = Graph(
                self.compiled,
                batch_size=self.batcher.largest,
                num_threads=self.num_threads,
                device_id=self._graph_device,
                encoded=self.encoded,
                seed=self.seed,
                exif=self.exif,
                pin_memory=self.pin_memory,
            )
        return self._graph

    def start(self) -> Loader:
        """Start the coming epoch's reads and first batches now; the next ``iter()`` takes them. Returns the Loader.

        A Loader does its first work when first iterated, so a job's first batch waits for a read and a graph run
        (about one batch at the Loader's full speed: 2-3% of a 31-batch epoch at 80% load, issue 36). Called right
        after building the Loader, while the job builds its model, it has the first batches ready instead::

            loader = Loader("train/", 64, transform=spec, shuffle=True).start()
            model = build_model()      # the Loader reads and decodes meanwhile
            for images, labels in loader: ...

        It does nothing during a pass, from a position a loaded state put inside an epoch, or with Ray ``workers``;
        a run it started that ``iter()`` does not ask for (``set_epoch`` to another epoch first) is stopped, and one
        left untaken stops after 20 s. The batches are the same either way.
        """
        if self.workers is not None or self._current() is not None or self._start != Cursor() or self._split:
            return self
        self._next.start(self._parts(self._orders.now()), self._built_graph(), self._epoch)
        return self

    def _ray_run(self, workers: RayWorkers, position: int, number: int) -> RayRun:
        """The epoch run on ``workers``' actors; they get the parts without the clock (their spans come back)."""
        parts = self._parts(self._fixed)
        compiled, finish = self._worker_spec or worker_spec(self.compiled, workers.transfer)
        setup = (dataclasses.replace(parts, clock=None), compiled, workers.cpus_per_worker)
        key = f"{self._ray_id}:{hash(parts.config)}"
        return RayRun(parts, workers.pool(), (key, setup), finish, self._epoch, self._split, position, number,
                      self.skipped, pin_memory=self.pin_memory)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled or deep-copied: the configuration and :meth:`state_dict`'s position, never the graph or threads."""
        return copied(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._local()
        self._orders.bind(self)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End a pass in progress and, for a remote source, stop its read-ahead and downloads.

        ``with Loader(...) as loader:`` calls it on leaving the block; a script need not call it at all.
        """
        self._end_pass("close() ended this pass")
        self._next.discard()
        self.reader.close()
