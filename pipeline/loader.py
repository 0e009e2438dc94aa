"""The Loader: a drop-in for ``torch.utils.data.DataLoader`` whose decode and augmentation run in a DALI graph.

Three stages run at once, joined by bounded queues, so that disk reads overlap with decoding and decoding with
the training step::

    reader thread                       graph thread                       the training loop
    rows from the sampler ─► read fields ─► DALI: decode + transforms ─► ─► next(loader) ─► (images, labels)
    check headers, draw params  [queue]    hand-off to torch (DLPack)  [queue]

The Loader is a facade: its keywords become frozen option parts (:mod:`.options`), its passes and state are
:class:`~stallfree.pipeline.epochs.Epochs`', and where the graph runs is a placement (:mod:`.placement`). The state
a checkpoint holds counts batches *delivered to the user*, never batches prefetched, so a resumed Loader yields
bit-identical batches from the next one on (DESIGN.md, "Known pitfalls").
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch

from stallfree.ingest.images import DEFAULT_MAX_PIXELS, Exif
from stallfree.ingest.remote import is_url
from stallfree.pipeline.arguments import BUILTIN_COLUMNS, check_dataloader_keywords, is_int
from stallfree.pipeline.epochs import STATE_VERSION, Epochs
from stallfree.pipeline.kinds import kind_of
from stallfree.pipeline.loader_sampler import LoaderOrder, Orders
from stallfree.pipeline.mix import Mix
from stallfree.pipeline.mix_reader import open_mix
from stallfree.pipeline.options import LoaderOptions, fingerprint_of
from stallfree.pipeline.packing import Packing
from stallfree.pipeline.process_group import UnknownRank, cache_rank
from stallfree.pipeline.ray_workers import RayWorkers
from stallfree.pipeline.reader_base import BaseReader, Reader
from stallfree.pipeline.readers import open_source, unwrap_torchvision_dataset
from stallfree.pipeline.run import Clock
from stallfree.pipeline.run_config import RunConfig
from stallfree.pipeline.samples import BadSampleError
from stallfree.pipeline.shards import Verify
from stallfree.pipeline.webdataset import is_webdataset
from stallfree.transforms.compile import CompiledTransforms, Dtype, Layout

__all__ = ["STATE_VERSION", "BadSampleError", "Clock", "Loader"]


def _check_exists(source: Any) -> Any:
    """A local path that does not exist, as a FileNotFoundError naming it (URLs and tar patterns are opened later)."""
    if isinstance(source, (str, os.PathLike)) and not is_url(source) and not is_webdataset(source):
        if not os.path.exists(source):
            raise FileNotFoundError(f"dataset {os.fspath(source)} does not exist")
    return source


def _open(source: Any, options: LoaderOptions) -> BaseReader:
    """The source's reader, opened with the source part of the options (refused where they do not apply)."""
    if isinstance(source, Mix):  # each of its sources opened as a source of its own
        return open_mix(source, lambda each: _open(_check_exists(each), options))
    order = options.order
    keywords = options.source.reader_keywords(source, remote=is_url(source), webdataset=is_webdataset(source),
                                              on_error=options.decode.on_error,
                                              rank=cache_rank(order.rank, order.world_size))
    return open_source(source, exif=options.decode.exif, verify=options.source.verify, remote=keywords,
                       on_error=options.decode.on_error)


def _columns(reader: Reader, columns: Sequence[str]) -> None:
    """``columns=``, each one the source has (its own columns, or the built-in ones), or a ValueError naming them."""
    available = list(reader.columns) + [c for c in BUILTIN_COLUMNS if c not in reader.columns]
    if columns and not set(columns) <= set(available):
        raise ValueError(f"columns={list(columns)} but the source has columns {available} (only ingested "
                         "shard folders have further columns: see `stallfree ingest`)")


class Loader:
    """Batches of ``(images, labels)`` torch tensors, decoded and augmented in a DALI graph.

    One pass at a time: each ``iter(loader)`` is a pass over an epoch. A pass ends when it is exhausted, fails, or
    its iterator is dropped (a ``break``), and when a new ``iter()``, :meth:`set_epoch` or :meth:`load_state_dict`
    starts another; the iterator of an ended pass raises ``RuntimeError`` on ``next`` and changes nothing. The
    next pass then uses the next epoch's order (as ``DataLoader(shuffle=True)`` draws a new one on every pass),
    unless :meth:`set_epoch` or :meth:`load_state_dict` chose where it starts.

    Args:
        source: an ImageFolder tree, a CSV or Parquet file list (``path``, ``label``), an ingested shard folder
            (or its URL: ``s3://``, ``gs://``, ``https://``, ``file://``; docs/remote.md), a ``Mix`` of token sources
            (docs/sequences.md), WebDataset tars read in place (a path or URL ending in ``.tar`` or with
            ``{first..last}`` ranges; docs/remote.md), a map-style torch ``Dataset`` of ``(image, label)`` items
            (see :class:`DatasetReader`), or a :class:`Reader`. A torchvision dataset (``ImageFolder(root,
            transform=...)``) brings its transforms (:func:`~stallfree.pipeline.readers.unwrap_torchvision_dataset`),
            so ``DataLoader(dataset, ...)`` becomes ``Loader(dataset, ...)``.
        batch_size: samples per batch.
        transform: the augmentation spec: a ``stallfree.transforms`` step, a list or a ``Compose`` of them, or
            torchvision's own transforms (``T.Compose``, ``v2.Compose``, one transform, a list), translated with
            their parameters (``stallfree.transforms.translation``). It must end at a fixed size.
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
        clock: where every pass reports its stages' spans (see :class:`Clock`), e.g. a ``StageClock``; a pass of
            :meth:`iterate` may be given one instead.
        columns: extra fields with each batch: ``"index"`` (the sample's row in the source) and ``"path"`` (its
            file, or the shard row or dataset item) for every source, and an ingested source's own columns
            (``stallfree ingest`` keeps a file list's further columns); when given, each batch is
            ``(images, labels, {name: tensor for numbers, list otherwise})``, and a token batch's dict has them
            under ``"columns"``, one per document piece (docs/sequences.md).
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

    The keywords build the Loader's :attr:`options`, small frozen parts that check their own fields
    (:mod:`stallfree.pipeline.options`).

    Raises:
        ValueError: for bad arguments or an empty dataset, before any work starts.
        TypeError: a keyword the Loader does not take, or a transform that cannot run in the graph (named).
    """

    #: As DataLoader's attribute for tools that read it (Lightning): batches are cut from the sampler's order in
    #: the graph, not by a batch sampler.
    batch_sampler: None = None

    def __init__(
        self,
        source: str | os.PathLike[str] | Reader | Mix | torch.utils.data.Dataset[Any],
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
        remote_min_rate: float = 1024.0,
        remote_rate_window: float = 30.0,
        workers: RayWorkers | None = None,
        packing: Packing | None = None,
        **dataloader_keywords: Any,
    ):
        check_dataloader_keywords(dataloader_keywords)
        self.dataset = source  # the source as given, as DataLoader's `.dataset` (before a torchvision one is unwrapped)
        source, transform, target_transform = unwrap_torchvision_dataset(source, transform, target_transform)
        self.options = options = LoaderOptions.of(
            batch_size=batch_size, transform=transform, shuffle=shuffle, block_shards=block_shards, seed=seed,
            drop_last=drop_last, rank=rank, world_size=world_size, device=device, placement=placement,
            num_threads=num_threads, prefetch=prefetch, io_threads=io_threads, echo=echo, echo_mode=echo_mode,
            on_error=on_error, verify=verify, max_pixels=max_pixels, exif=exif, dtype=dtype, layout=layout,
            channels=channels, clock=clock, columns=columns, pin_memory=pin_memory, target_transform=target_transform,
            workers=workers, packing=packing, source={"cache_dir": cache_dir, "cache_limit": cache_limit,
                                     "storage_options": storage_options, "downloads": downloads,
                                     "read_ahead": read_ahead, "retries": retries, "remote_timeout": remote_timeout,
                                     "remote_min_rate": remote_min_rate, "remote_rate_window": remote_rate_window},
            then=lambda: _check_exists(source))
        reader = _open(source, options)
        _columns(reader, options.output.columns)
        kind = kind_of(reader)
        kind.check(options, reader)
        order, output, decode = options.order, options.output, options.decode
        self.labels = reader.labels()
        orders = Orders(self, order.rank, order.world_size, kind.orders(options, reader))
        batcher = order.batcher()
        config = RunConfig(batcher=batcher, seed=order.seed, prefetch=options.run.prefetch,
                           io_threads=options.run.io_threads, on_error=decode.on_error, max_pixels=decode.max_pixels,
                           exif=decode.exif, encoded=bool(reader.encoded), device=output.device)
        self._epochs = Epochs(reader=reader, orders=orders, batcher=batcher, compiled=decode.compiled, config=config,
                              placement=kind.placement(options, config.encoded),
                              assembly=kind.assembly(options, reader),
                              fingerprint=functools.partial(fingerprint_of, reader, options), clock=options.run.clock)
        try:  # an empty dataset, or drop_last over more ranks than samples, refused now
            self.sampler  # noqa: B018
        except UnknownRank:  # a rank known only once the process group is: at the pass
            pass

    @property
    def reader(self) -> Reader:
        """The source's rows (:class:`Reader`)."""
        return self._epochs.reader

    @property
    def batcher(self) -> Any:
        """What a batch is (:mod:`stallfree.pipeline.batcher`)."""
        return self._epochs.batcher

    @property
    def compiled(self) -> CompiledTransforms:
        """The transforms as the graph runs them."""
        return self.options.decode.compiled

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return int(self.options.order.batch_size)

    @property
    def device(self) -> torch.device:
        """Where batches are delivered."""
        return self.options.output.device

    @property
    def workers(self) -> RayWorkers | None:
        """Where the graph runs: ``None`` (this process) or the :class:`RayWorkers`."""
        return self.options.run.workers

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """This epoch's skipped samples (``on_error="skip"``): what a resumed Loader carries on."""
        return self._epochs.standing.skipped

    @property
    def sampler(self) -> LoaderOrder:
        """The order of the pass in progress, else of a loaded state, else of this rank now.

        ``loader.sampler.set_epoch`` is :meth:`set_epoch` (Lightning's fit loop calls it).
        """
        return self._epochs.sampler

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        return self.reader.classes

    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress, or else of the next pass."""
        return self._epochs.epoch

    def __len__(self) -> int:
        """Batches this rank yields per epoch (a pass resumed elastically yields only the epoch's remainder)."""
        epochs = self._epochs
        standing = epochs.standing
        return epochs.batcher.deliveries(epochs.order_of(epochs.shard()).length(standing.split, None, epochs.epoch))

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation and augmentation next; it ends a pass in progress that delivered batches.

        Epochs also advance by themselves after each pass. One rule (:mod:`stallfree.pipeline.epochs`): setting the
        epoch the Loader stands in keeps its place when nothing was delivered since it came there (a loaded state,
        or between ``iter()`` and the first batch, where Lightning's fit loop calls it, as a DataLoader's order is
        drawn on the first ``next``); any other call moves it to ``epoch``'s start.
        """
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self._epochs.set_epoch(int(epoch))

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order and pixels (with the world size, not the rank); a state of another is refused."""
        return self._epochs.fingerprint()

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered to the caller (JSON-serialisable).

        While a pass is in progress that is where it stands; after a pass has ended it is the start of the next
        epoch (or what :meth:`set_epoch`/:meth:`load_state_dict` chose), which is where ``iter()`` goes on. Each
        stage's part nests under its name (:mod:`stallfree.pipeline.loader_state`).
        """
        return self._epochs.state_dict()

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
        self._epochs.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        return self._epochs.iterate()

    def iterate(self, clock: Clock | None = None) -> Iterator[Any]:
        """A pass, as ``iter(loader)``, whose stages report their spans to ``clock`` (where the Loader has none).

        The profiler times a user's Loader this way (``stallfree.profile``): the clock is given when the pass's
        run is built, never set on the Loader from outside.
        """
        return self._epochs.iterate(clock)

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
        self._epochs.start()
        return self

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled or deep-copied (:mod:`stallfree.pipeline.lifecycle`): its orders answer to the copy."""
        vars(self).update(state)
        self._epochs.orders.bind(self)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End a pass in progress and, for a remote source, stop its read-ahead and downloads.

        ``with Loader(...) as loader:`` calls it on leaving the block; a script need not call it at all.
        """
        self._epochs.close()
        self.reader.close()
