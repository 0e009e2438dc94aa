"""The differential measurements of ``stallfree profile``, each on its own: storage, preparation, compute.

DS-Analyzer (Mohan et al., VLDB 2021) isolates each stage by removing the others: storage is read with nothing
decoded; preparation runs from bytes already in memory; compute runs on synthetic tensors already on the device
(the ideal rate). :func:`.profile_run.profile_dataset` then runs them together.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stallfree.core.accelerator import SimAccelerator
from stallfree.pipeline.reader_base import sample_of
from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.models import zoo
from stallfree.stage_runtime.profile.cache import drop_page_cache

__all__ = [
    "MODEL_ALIASES", "ComputeResult", "InMemoryReader", "PrepPoint", "StorageResult", "build_model", "dataset_files",
    "drop_page_cache", "make_train_step", "measure_compute", "measure_preparation", "measure_storage",
]

Progress = Callable[[int], Any] | None


def dataset_files(data: str | os.PathLike[str], reader: Any = None) -> list[Path]:
    """The files a dataset is read from: the reader's ``paths`` when it has them, else every file under ``data``."""
    paths = getattr(reader, "paths", None)
    if paths is not None:
        return [Path(p) for p in paths]
    root = Path(data)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file())


@dataclass(frozen=True)
class StorageResult:
    """Read throughput of the dataset's files, cold (page cache dropped) and warm."""

    files: int
    bytes: int
    threads: int
    cold_bytes_per_s: float
    warm_bytes_per_s: float
    cold_files_per_s: float
    warm_files_per_s: float
    cold_note: str | None  # why the cold read may not be cold; None when the cache was dropped
    cold_resident_fraction: float | None  # of the files' pages still cached before the cold read (mincore)
    cache_dropped: bool  # the pages were checked and had left the cache: the cold figures are cold


def _read_all(paths: Sequence[Path], threads: int, clock: StageClock | None, stage: str,
              progress: Progress) -> tuple[int, float]:
    def one(path: Path) -> int:
        start = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            size = 0
            while chunk := f.read(1 << 20):
                size += len(chunk)
        if clock is not None:
            clock.record(stage, "busy", start, time.perf_counter())
        return size

    start = time.perf_counter()
    total = 0
    with ThreadPoolExecutor(threads) as pool:
        for size in pool.map(one, paths):
            total += size
            if progress is not None:
                progress(1)
    return total, time.perf_counter() - start


def measure_storage(paths: Sequence[Path], threads: int = 4, clock: StageClock | None = None,
                    progress: Progress = None) -> StorageResult:
    """Read every file whole with ``threads`` threads: once after dropping its cached pages, once warm.

    ``cold_note`` says when the pages did not leave the cache (see :mod:`.profile_cache`): the cold figures are
    then warm ones.
    """
    if not paths:
        raise ValueError("no files to read for the storage phase")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    drop = drop_page_cache(paths)
    size, cold = _read_all(paths, threads, clock, "storage (cold)", progress)
    _, warm = _read_all(paths, threads, clock, "storage (warm)", progress)
    n = len(paths)
    return StorageResult(n, size, threads, size / cold, size / warm, n / cold, n / warm, drop.note,
                         drop.resident_fraction, drop.dropped)


class InMemoryReader:
    """A :class:`stallfree.pipeline.readers.Reader` over rows copied into memory from another reader.

    Args:
        reader: the dataset's reader.
        rows: how many rows to keep (the first ``rows``; all by default).
    """

    def __init__(self, reader: Any, rows: int | None = None):
        count = len(reader) if rows is None else min(rows, len(reader))
        self.classes = list(reader.classes)
        self.encoded = bool(reader.encoded)
        self._data = [np.frombuffer(bytes(sample_of(reader.read(i))["image"]), np.uint8) for i in range(count)]
        self._labels = np.asarray(reader.labels()[:count], dtype=np.int64)
        self._names = [reader.describe(i) for i in range(count)]

    def __len__(self) -> int:
        return len(self._data)

    def labels(self) -> np.ndarray:
        """Every row's label."""
        return self._labels

    def read(self, index: int) -> dict[str, np.ndarray]:
        """Row ``index``'s image bytes, from memory."""
        return {"image": self._data[index]}

    def describe(self, index: int) -> str:
        """The row's original location."""
        return f"{self._names[index]} (in memory)"

    columns: tuple[str, ...] = ()

    def column(self, name: str, rows: np.ndarray) -> np.ndarray:
        """An in-memory copy keeps no extra columns."""
        raise KeyError(f"no column {name!r}: the profiler's in-memory copy keeps images and labels only")

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(a.nbytes for a in self._data)


@dataclass(frozen=True)
class PrepPoint:
    """Decode + augment throughput from memory at one thread count."""

    threads: int
    images_per_s: float


def measure_preparation(make_loader: Callable[[int], Any], thread_counts: Sequence[int], batches: int,
                        batch_size: int, progress: Progress = None) -> list[PrepPoint]:
    """Images per second of ``make_loader(threads)`` (a loader over in-memory bytes) at each thread count.

    Each loader's first batch (graph build) is not timed.
    """
    points = []
    for threads in thread_counts:
        loader = make_loader(threads)
        iterator = iter(loader)
        next(iterator)
        start = time.perf_counter()
        done = 0
        for _ in range(batches):
            if next(iterator, None) is None:
                break
            done += 1
            if progress is not None:
                progress(1)
        elapsed = time.perf_counter() - start
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        if done == 0:
            raise ValueError(f"the preparation phase got no batch after the first: the in-memory sample of "
                             f"the dataset holds fewer than 2 batches of {batch_size}")
        points.append(PrepPoint(threads, done * batch_size / elapsed))
    return points


MODEL_ALIASES = {"cnn": "small_cnn"}  # --model names the profiler takes besides the trainer's


def build_model(name: str, num_classes: int, image_size: int) -> Any:
    """The model for ``--model``: the trainer's factory (``stage_runtime.models``); ``cnn`` means ``small_cnn``."""
    return zoo.build_model(MODEL_ALIASES.get(name, name), num_classes=num_classes, image_size=image_size)


def make_train_step(model: Any, device: Any, lr: float = 0.01) -> Callable[[Any], float]:
    """A training step (SGD, cross-entropy) on ``(images, labels)``; waits for the device so timing is honest."""
    model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    is_cuda = torch.device(device).type == "cuda"

    def step(batch: Any) -> float:
        images, labels = batch
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        if is_cuda:
            torch.cuda.synchronize(device)
        return float(loss.detach())

    return step


@dataclass(frozen=True)
class ComputeResult:
    """The model's training step on synthetic tensors already on the device: the ideal rate."""

    model: str
    device: str
    batch_size: int
    step_s: float  # median
    images_per_s: float


def simulated_step(device: SimAccelerator) -> Callable[[Any], None]:
    """A training step on the simulated ``device``: it waits the device's time for the batch's labels (no CPU)."""
    def step(batch: Any) -> None:
        device.step(len(batch[1]))
    return step


def measure_compute(model_name: str, model: Any, device: Any, batch_size: int, image_size: int,
                    num_classes: int, steps: int, clock: StageClock | None = None,
                    progress: Progress = None) -> ComputeResult:
    """Time ``steps`` training steps (after 2 untimed) on one synthetic batch kept on ``device``."""
    step = make_train_step(model, device)
    images = torch.randn(batch_size, 3, image_size, image_size, device=device)
    labels = torch.randint(0, num_classes, (batch_size,), device=device)
    for _ in range(2):
        step((images, labels))
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step((images, labels))
        end = time.perf_counter()
        times.append(end - start)
        if clock is not None:
            clock.record("compute (synthetic)", "busy", start, end, i)
        if progress is not None:
            progress(1)
    median = statistics.median(times)
    return ComputeResult(model_name, str(device), batch_size, median, batch_size / median)
