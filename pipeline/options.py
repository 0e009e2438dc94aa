"""The Loader's options as small frozen parts, each checking its own fields; the flat keywords are a facade.

``Loader(source, batch_size, shuffle=True, device="cuda", ...)`` takes DataLoader's flat keywords and builds these
parts from them (:meth:`LoaderOptions.of`), as SPDL maps DataLoader's keywords onto one config per stage:

========================  ===========================================================  ==================
part                      fields                                                       in the fingerprint
========================  ===========================================================  ==================
:class:`OrderOptions`     batch_size, shuffle, block_shards, seed, drop_last, echo,     yes (not the rank)
                          echo_mode, rank, world_size, packing
:class:`DecodeOptions`    transform (compiled with dtype, layout, channels),             yes (not on_error)
                          max_pixels, exif, on_error
:class:`OutputOptions`    device, placement, pin_memory, columns, target_transform       no
:class:`RunOptions`       num_threads, prefetch, io_threads, clock, workers              no
:class:`~stallfree.pipeline.source_options.SourceOptions`  verify and the remote keywords  no
========================  ===========================================================  ==================

A new keyword is one field in one part, checked there; the fingerprint (what a resumed state must match) is the
parts that decide the order and the pixels, never where or how fast the work runs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from stallfree.core.device import parse_device
from stallfree.ingest.images import DEFAULT_MAX_PIXELS, EXIF_MODES, Exif
from stallfree.pipeline.arguments import describe_spec, dtype_name, is_int, source_identity
from stallfree.pipeline.batcher import CountBatcher
from stallfree.pipeline.packing import Packing
from stallfree.pipeline.ray_workers import RayWorkers
from stallfree.pipeline.reader_base import Reader
from stallfree.pipeline.run import Clock
from stallfree.pipeline.source_options import SourceOptions
from stallfree.transforms.compile import CompiledTransforms, Dtype, Layout
from stallfree.transforms.translation.translator import to_steps

__all__ = ["DecodeOptions", "LoaderOptions", "OrderOptions", "OutputOptions", "RunOptions", "Shuffle", "fingerprint_of"]

Shuffle = Literal["none", "global", "block"]
Placement = Literal["auto", "cpu", "gpu"]


def _choice(name: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def _count(name: str, value: Any) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class OrderOptions:
    """Which samples each batch of each rank holds: the order, the batches, echo and the shard of ranks.

    ``shuffle`` is ``"none"``, ``"global"`` or ``"block"`` (:meth:`LoaderOptions.of` takes DataLoader's bool too);
    ``rank``/``world_size`` ``None`` are decided when a pass starts (:mod:`~stallfree.pipeline.process_group`);
    ``packing`` packs token sequences into rows (:mod:`~stallfree.pipeline.packing`; a batch is ``batch_size``
    rows).
    """

    batch_size: int
    shuffle: Shuffle = "none"
    block_shards: int = 8
    seed: int = 0
    drop_last: bool = False
    echo: int = 1
    echo_mode: Literal["example", "batch"] = "example"
    rank: int | None = None
    world_size: int | None = None
    packing: Packing | None = None

    def __post_init__(self) -> None:
        if self.packing is not None and not isinstance(self.packing, Packing):
            raise TypeError(f"packing must be None or stallfree.Packing(seq_len=...), got {self.packing!r}")
        if not is_int(self.batch_size) or self.batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {self.batch_size!r}")
        _flag("drop_last", self.drop_last)
        if self.shuffle not in ("none", "global", "block"):
            raise ValueError(f"shuffle must be True (or 'global'), 'block' (the shard-block shuffle) or False, got "
                             f"{self.shuffle!r}")
        if not is_int(self.block_shards) or self.block_shards < 1:
            raise ValueError(f"block_shards must be an int >= 1 (shards per shuffle block), got {self.block_shards!r}")
        if not is_int(self.seed):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        _count("echo", self.echo)
        _choice("echo_mode", self.echo_mode, ("example", "batch"))

    @property
    def sample_echo(self) -> int:
        """The sampler's echo: each sample ``k`` times per epoch (``echo_mode="example"``), else 1."""
        return self.echo if self.echo_mode == "example" else 1

    def batcher(self) -> CountBatcher:
        """What a batch is: ``batch_size`` samples, each batch delivered ``echo`` times in batch mode."""
        return CountBatcher(self.batch_size, bool(self.drop_last), self.echo if self.echo_mode == "batch" else 1)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order (the world size is the Loader's to add; the rank is in no fingerprint)."""
        shuffle: str | bool = f"block/{self.block_shards}" if self.shuffle == "block" else self.shuffle == "global"
        packing = self.packing.fingerprint() if self.packing is not None else None
        return {"shuffle": shuffle, "drop_last": bool(self.drop_last), "seed": int(self.seed),
                "batch_size": int(self.batch_size), "echo": int(self.echo), "echo_mode": self.echo_mode,
                "packing": packing}


@dataclass(frozen=True)
class DecodeOptions:
    """What the pixels are: the compiled transforms, the header check's bound, EXIF, and what a bad sample does."""

    compiled: CompiledTransforms
    max_pixels: int = DEFAULT_MAX_PIXELS
    exif: Exif = "ignore"
    on_error: Literal["raise", "skip"] = "raise"

    def __post_init__(self) -> None:
        _check_decode(self.max_pixels, self.exif, self.on_error)

    @staticmethod
    def compile(transform: Any, dtype: Dtype | torch.dtype | None, layout: Layout, channels: int) -> CompiledTransforms:
        """``transform=`` (stallfree's steps or torchvision's objects) compiled for the graph.

        ``dtype`` ``None`` is what a translated torchvision pipeline ends with (uint8 after ``PILToTensor``), else
        float32.
        """
        spec = to_steps(transform)
        out: Dtype = dtype_name(dtype) if dtype is not None else (spec.dtype or "float32")
        return CompiledTransforms(spec.steps, dtype=out, layout=layout, channels=channels)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the pixels."""
        compiled = self.compiled
        return {"max_pixels": int(self.max_pixels), "exif": self.exif, "transform": describe_spec(compiled.steps),
                "dtype": compiled.dtype, "layout": compiled.layout, "channels": compiled.channels}


@dataclass(frozen=True)
class OutputOptions:
    """Where and how batches are delivered: the device (parsed once), the graph's placement, pinning, extra fields.

    ``pin_memory`` is what is done: ``True`` only with a CPU device and CUDA present (:meth:`LoaderOptions.of`
    warns where it was asked for without CUDA, as DataLoader does).
    """

    device: torch.device
    placement: Placement = "auto"
    pin_memory: bool = False
    columns: tuple[str, ...] = ()
    target_transform: Callable[[int], Any] | None = None

    def __post_init__(self) -> None:
        _choice("placement", self.placement, ("auto", "cpu", "gpu"))
        _flag("pin_memory", self.pin_memory)
        if self.placement == "gpu" and self.device.type != "cuda":
            raise ValueError("placement='gpu' needs a CUDA device=; got device='cpu'")
        if self.pin_memory and self.device.type != "cpu":
            raise ValueError(f"pin_memory=True pins CPU batches, but device={str(self.device)!r} delivers them on the "
                             "GPU already; drop pin_memory, or use device='cpu' to copy them yourself")
        if self.target_transform is not None and not callable(self.target_transform):
            raise ValueError(f"target_transform must be a callable applied to each label, got "
                             f"{type(self.target_transform).__name__}")

    @property
    def graph_on_gpu(self) -> bool:
        """Whether the graph runs on the delivery GPU (``placement``, and ``"auto"`` with a CUDA device)."""
        return self.placement == "gpu" or (self.placement == "auto" and self.device.type == "cuda")


@dataclass(frozen=True)
class RunOptions:
    """How the work runs: DALI's and the reader's threads, batches ahead, the stage clock, Ray workers."""

    num_threads: int | None = None
    prefetch: int = 2
    io_threads: int = 4
    clock: Clock | None = None
    workers: RayWorkers | None = None

    def __post_init__(self) -> None:
        _count("prefetch", self.prefetch)
        _count("io_threads", self.io_threads)
        if self.num_threads is not None and (not is_int(self.num_threads) or self.num_threads <= 0):
            raise ValueError(f"num_threads must be positive (or None for the cores this process may use), got "
                             f"{self.num_threads!r}")
        if self.clock is not None and not callable(getattr(self.clock, "record", None)):
            raise ValueError(f"clock must have a record(stage, state, start, end, batch) method (a StageClock has), "
                             f"got {type(self.clock).__name__}")
        if self.workers is not None and not isinstance(self.workers, RayWorkers):
            raise TypeError(f"workers must be None or stallfree.RayWorkers(...), got {self.workers!r}")

    @property
    def threads(self) -> int:
        """DALI's threads: ``num_threads``, else the cores this process may use."""
        return self.num_threads or len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class LoaderOptions:
    """Every option of a Loader, by part."""

    order: OrderOptions
    decode: DecodeOptions
    output: OutputOptions
    run: RunOptions
    source: SourceOptions

    def __post_init__(self) -> None:
        if self.output.placement == "gpu" and self.run.workers is not None:
            raise ValueError("placement='gpu' with workers=RayWorkers(...): Ray workers run DALI's CPU operators; "
                             "use placement='auto' (batches are still delivered on device=)")

    @property
    def graph_device(self) -> int | None:
        """The GPU the graph runs on, or ``None`` for DALI's CPU operators (always so on Ray workers)."""
        on_gpu = self.output.graph_on_gpu and self.run.workers is None
        return self.output.device.index if on_gpu else None

    @classmethod
    def of(cls, *, batch_size: Any, transform: Any, shuffle: Any, block_shards: Any, seed: Any, drop_last: Any,
           rank: Any, world_size: Any, device: Any, placement: Any, num_threads: Any, prefetch: Any, io_threads: Any,
           echo: Any, echo_mode: Any, on_error: Any, verify: Any, max_pixels: Any, exif: Any, dtype: Any, layout: Any,
           channels: Any, clock: Any, columns: Any, pin_memory: Any, target_transform: Any,
           source: dict[str, Any], workers: Any, packing: Any = None,
           then: Callable[[], None] = lambda: None) -> LoaderOptions:
        """The parts from the Loader's flat keywords, each checked where it belongs (a ``ValueError`` naming it).

        ``source`` holds :class:`SourceOptions`' fields but ``verify``; ``then`` runs after the cheap checks and
        before the transform compiles (the Loader's check that its path exists: a wrong path must not be hidden
        behind a transform's message).
        """
        order = OrderOptions(batch_size, _shuffle(shuffle), block_shards, seed, drop_last, echo, echo_mode, rank,
                             world_size, packing)
        run = RunOptions(num_threads, prefetch, io_threads, clock, workers)
        _check_decode(max_pixels, exif, on_error)  # before the transform compiles, which takes longer
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
            example = [columns] if isinstance(columns, str) else ["key"]
            raise ValueError(f"columns must be a list of column names, e.g. columns={example!r}; got {columns!r}")
        _flag("pin_memory", pin_memory)
        output = OutputOptions(parse_device(device, what="device", instead="a Loader on the CPU"), placement,
                               _pin(bool(pin_memory)), tuple(columns), target_transform)
        options = SourceOptions(verify=verify, **source)
        then()
        decode = DecodeOptions(DecodeOptions.compile(transform, dtype, layout, channels), max_pixels, exif, on_error)
        return cls(order, decode, output, run, options)


def _check_decode(max_pixels: Any, exif: Any, on_error: Any) -> None:
    if not is_int(max_pixels) or max_pixels <= 0:
        raise ValueError(f"max_pixels must be a positive int, got {max_pixels!r}")
    if exif not in EXIF_MODES:
        raise ValueError(f"exif must be 'ignore' or 'apply', got {exif!r}")
    _choice("on_error", on_error, ("raise", "skip"))


def _shuffle(shuffle: Any) -> Any:
    """DataLoader's ``shuffle`` (a bool) as the mode's name; anything else as it is (the part checks it)."""
    if isinstance(shuffle, (bool, np.bool_)):
        return "global" if shuffle else "none"
    return shuffle


def _pin(pin_memory: bool) -> bool:
    """DataLoader's rule: pinning without CUDA warns and does nothing."""
    if pin_memory and not torch.cuda.is_available():
        warnings.warn("pin_memory=True but torch sees no CUDA device: batches stay in ordinary memory (as "
                      "DataLoader does)", UserWarning, stacklevel=4)
        return False
    return pin_memory


def fingerprint_of(reader: Reader, options: LoaderOptions) -> dict[str, Any]:
    """What decides a Loader's order and pixels: its source and the parts that say so (not the world size)."""
    order = options.order.fingerprint()
    packing, compiled = options.order.packing, options.decode.compiled
    if packing is not None and callable(packing.image_tokens) and compiled.steps:  # what the function gives
        order["packing"] = {**order["packing"], "image_tokens": packing.tokens_per_image(compiled.output_size)}
    return {"source": source_identity(reader), "num_rows": len(reader), **order, **options.decode.fingerprint()}
