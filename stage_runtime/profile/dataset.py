"""``stallfree.profile_dataset(data, ...)``: the five-phase differential run behind ``stallfree profile``.

The phases, each timed into one stage clock (DS-Analyzer, Mohan et al., VLDB 2021)::

    1 storage            read every file whole, page cache dropped, then warm        -> bytes/s, files/s
    2 preparation        decode + augment from bytes in memory at 1, 2, 4 .. N threads -> the scaling curve
    3 compute            the model's step on synthetic tensors on the device        -> t_ideal
    4 real run           the Loader from storage (cache dropped) feeding the step   -> t_real, the measured wait
    5 real run, memory   the same from the in-memory copy                           -> t_cached

then the stalls (:func:`.report.differential_stalls`), the what-ifs from the real run's stage clock
(:mod:`.what_ifs`), and with ``verify=`` one more real run with a what-if applied, held against its prediction
(:mod:`.verify`). It returns a :class:`DatasetProfile`; it prints nothing to stdout (progress bars go to
stderr).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil
import torch
from tqdm import tqdm

from stallfree.core.accelerator import SimAccelerator, parse_accelerator
from stallfree.core.atomic import atomic_write
from stallfree.core.device import check_device
from stallfree.stage_runtime.baseline import torch_dataloader, transform_label
from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.config.train_config import TOKEN_MODELS
from stallfree.stage_runtime.models.zoo import resolve
from stallfree.stage_runtime.profile import phases as ph
from stallfree.stage_runtime.profile import text
from stallfree.stage_runtime.profile.chart import draw_profile
from stallfree.stage_runtime.profile.loop import profile
from stallfree.stage_runtime.profile.report import differential_stalls, headline, input_cost
from stallfree.stage_runtime.profile.sampler import ResourceSampler
from stallfree.stage_runtime.profile.schema import check_schema
from stallfree.stage_runtime.profile.verify import chosen, resized_copy, verdict_of
from stallfree.stage_runtime.profile.what_ifs import Observed, what_ifs

__all__ = ["DatasetProfile", "profile_dataset"]

Verify = Literal["top", "echo", "max-side", "cores"]
VERIFY_CHOICES: tuple[str, ...] = ("top", "echo", "max-side", "cores")


@dataclass(frozen=True)
class DatasetProfile:
    """What :func:`profile_dataset` measured: ``result`` is ``profile.json``'s content (see docs/profile.md)."""

    result: dict[str, Any]
    clock: StageClock = field(repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """``profile.json``'s content."""
        return self.result

    @property
    def headline(self) -> str:
        """One line: the bottleneck, and the stalls only when the run waited."""
        return headline(self.result["stalls"])

    def save(self, folder: str | os.PathLike[str]) -> list[Path]:
        """Write ``profile.json``, ``trace.json`` (open it in https://ui.perfetto.dev) and ``profile.png``."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "profile.json", json.dumps(self.result, indent=2).encode())
        self.clock.to_chrome_trace(out / "trace.json")
        return [out / "profile.json", out / "trace.json", draw_profile(self.result, out / "profile.png")]

    def table(self) -> str:
        """The human report: one row per phase, the headline, the what-ifs with their assumptions."""
        return text.report(self.result)


def _check(batch_size: int, image_size: int, batches: int, **optional: int | None) -> None:
    for name, value in (("batch_size", batch_size), ("image_size", image_size), ("batches", batches)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    for name, maybe in optional.items():
        if maybe is not None and maybe < 1:
            raise ValueError(f"{name} must be >= 1, got {maybe}")


def _thread_counts(most: int) -> list[int]:
    counts, k = [], 1
    while k < most:
        counts.append(k)
        k *= 2
    return [*counts, most]


def _forever(make: Callable[[], Any]) -> Iterator[Any]:
    while True:
        yield from make()


def profile_dataset(
    data: str | os.PathLike[str],
    *,
    model: str = "mlp",
    batch_size: int = 64,
    image_size: int = 224,
    batches: int = 20,
    threads: int | None = None,
    torch_threads: int | None = None,
    device: str | None = None,
    compare: Literal["torch"] | None = None,
    max_side: int | None = None,
    storage_files: int | None = None,
    verify: Verify | None = None,
    accelerator: str | SimAccelerator | None = None,
    progress: bool = True,
) -> DatasetProfile:
    """Profile training on ``data``: which stage stalls the step, by how much, and what would remove it.

    Args:
        data: an ImageFolder tree or a CSV/Parquet file list.
        model: a model name of the trainer's factory (``mlp``, ``small_cnn``, ``resnet18`` ...) or
            ``package.module:fn``.
        batch_size: samples per batch.
        image_size: the ``RandomResizedCrop`` output side.
        batches: timed batches per run.
        threads: the most preparation threads (default: the cores this process may use); the real runs use it.
        torch_threads: torch's intra-op threads for the step (restored afterwards).
        device: ``cpu`` or ``cuda[:N]`` (default: cuda when available).
        compare: ``"torch"`` also runs torch's DataLoader over the same files.
        max_side: the ``--max-side`` what-if's cap (default: ``image_size * 256 / 224``).
        storage_files: read at most this many files in the storage phase.
        verify: run one what-if for real and compare it with its prediction: ``"top"`` (the suggested one),
            ``"echo"``, ``"max-side"`` or ``"cores"``.
        accelerator: ``"sim:R"`` (parsed here, once) or a :class:`SimAccelerator`: the step is a simulated device
            training ``R`` img/s (it waits, holding no CPU; see ``stallfree.core.accelerator``) instead of
            the model on this machine, so the real runs answer "with a device of this speed, would this loader
            stall?".
        progress: progress bars on stderr.

    Raises:
        ValueError: a bad argument (a device this machine lacks, an unknown model), checked before any phase
            runs, or a dataset with fewer than three batches.
    """
    _check(batch_size, image_size, batches, threads=threads, torch_threads=torch_threads, max_side=max_side,
           storage_files=storage_files)
    if verify is not None and verify not in VERIFY_CHOICES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_CHOICES)} or None, got {verify!r}")
    if compare not in (None, "torch"):
        raise ValueError(f"compare must be 'torch' or None, got {compare!r}")
    device_model = parse_accelerator(accelerator)  # where the string enters; below, the typed value
    # Before any phase runs: a GPU this machine lacks, or a model name that does not resolve, fails in one line.
    device = check_device(device)
    if model in TOKEN_MODELS:
        raise ValueError(f"--model {model} is a token model; stallfree profile feeds a model images (profile an "
                         f"image model, or train it with stallfree train --model {model}: it reports the input stall)")
    if device_model is None:
        resolve(ph.MODEL_ALIASES.get(model, model))
    previous = torch.get_num_threads()
    if torch_threads:
        torch.set_num_threads(torch_threads)
    try:
        run = _Run(Path(data), model, batch_size, image_size, batches, threads, device, progress, device_model)
        return run.result(compare, max_side, storage_files, verify)
    finally:
        torch.set_num_threads(previous)  # the setting is process-wide; leave it as we found it


def _slowdown(step_s: float, alone_s: float) -> float:
    """How much longer the step took while the Loader fed it than alone (0.05: 5% longer)."""
    return step_s / alone_s - 1 if alone_s > 0 else 0.0


class _Run:
    """One profile's state: the dataset, the clock, the resource sampler, and the phases in order."""

    def __init__(self, data: Path, model: str, batch: int, image_size: int, batches: int, threads: int | None,
                 device: str | None, progress: bool, accelerator: SimAccelerator | None = None):
        from stallfree.pipeline.readers import open_source  # DALI, an extra: needed once the arguments passed
        from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop  # likewise

        self.data, self.model_name, self.batch, self.image_size, self.batches = data, model, batch, image_size, batches
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.threads = threads or self.cores
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.reader = open_source(data)
        self.paths = ph.dataset_files(data, self.reader)
        needed = batch * 3  # warm-up batches plus one timed
        if len(self.reader) < needed:
            raise ValueError(f"{data} has {len(self.reader)} samples; profiling needs at least {needed} "
                             f"(3 batches of {batch}): lower the batch size")
        self.transform = [RandomResizedCrop(image_size), RandomHorizontalFlip(), Normalize()]
        self.clock = StageClock()
        self.progress = progress
        self.sampler: Any = None
        self.accelerator = accelerator  # the step waits as that device would (None: the model runs here)

    @contextmanager
    def phase(self, name: str, total: int) -> Iterator[Callable[[int], Any]]:
        self.sampler.phase = name
        if not self.progress:
            yield lambda n: None
            return
        with tqdm(total=total, desc=name, unit="it", file=sys.stderr, mininterval=0.5, leave=True) as bar:
            yield bar.update

    def loader(self, source: Any, **settings: Any) -> Any:
        from stallfree.pipeline.loader import Loader  # DALI, an extra: needed once the arguments passed

        return Loader(source, self.batch, transform=self.transform, drop_last=True,
                      **{"shuffle": True, "num_threads": self.threads, "device": self.device, **settings})

    def timed(self, name: str, loader: Any) -> Any:
        runs = min(self.batches, len(loader) - 2)
        with self.phase(name, runs) as tick:
            return profile(loader, self.step, batches=runs, warmup=2, clock=self.clock, progress=tick)

    def result(self, compare: str | None, max_side: int | None, storage_files: int | None,
               verify: Verify | None) -> DatasetProfile:
        self.sampler = ResourceSampler(0.1).start()
        origin = time.perf_counter()
        try:
            out = self._phases(compare, storage_files)
            out.update(self._conclusions(out, max_side))
            if verify is not None:
                out["verify"] = self._verify(out, verify)
        finally:
            self.sampler.stop()
        out["resources"] = self.sampler.to_dicts(origin)
        out["clock"] = {"spans": len(self.clock), "dropped": self.clock.dropped}
        check_schema(out)
        return DatasetProfile(out, self.clock)

    def _phases(self, compare: str | None, storage_files: int | None) -> dict[str, Any]:
        batch = self.batch
        storage_paths = self.paths[:storage_files] if storage_files else self.paths
        with self.phase("1 storage", 2 * len(storage_paths)) as tick:
            storage = ph.measure_storage(storage_paths, threads=4, clock=self.clock, progress=tick)
        self.in_memory = ph.InMemoryReader(self.reader, rows=min(len(self.reader), batch * (self.batches + 2)))
        counts = _thread_counts(self.threads)
        prep_batches = max(2, self.batches // 2)
        with self.phase("2 preparation", prep_batches * len(counts)) as tick:
            def make(k: int) -> Iterator[Any]:
                return _forever(lambda: self.loader(self.in_memory, num_threads=k, device="cpu"))
            prep = ph.measure_preparation(make, counts, prep_batches, batch, progress=tick)
        self.step: Callable[[Any], object]  # the training step; what it returns (a loss, or nothing) is unused
        if self.accelerator is None:
            classes = len(self.reader.classes)
            model = ph.build_model(self.model_name, classes, self.image_size)
            with self.phase("3 compute", self.batches) as tick:
                compute = ph.measure_compute(self.model_name, model, self.device, batch, self.image_size, classes,
                                             self.batches, clock=self.clock, progress=tick)
            self.step = ph.make_train_step(model, self.device)
        else:
            rate = self.accelerator.images_per_s
            compute = ph.ComputeResult(self.model_name, str(self.accelerator), batch, batch / rate, rate)
            self.step = ph.simulated_step(self.accelerator)
        cold = ph.drop_page_cache(self.paths)
        real = self.timed("4 real run", self.loader(self.data))
        cached = self.timed("5 real run, from memory", self.loader(self.in_memory))
        self.real, self.cached, self.prep, self.compute = real, cached, prep, compute
        out: dict[str, Any] = {
            "format": "stallfree-profile/1", "data": str(self.data), "images": len(self.reader),
            "model": self.model_name, "device": str(self.device), "batch_size": batch, "image_size": self.image_size,
            "cores": self.cores, "threads": self.threads, "torch_threads": torch.get_num_threads(),
            "phases": {
                "storage": {**vars(storage), "cold_images_per_s": storage.cold_files_per_s,
                            "warm_images_per_s": storage.warm_files_per_s},
                "preparation": {"points": [vars(p) for p in prep], "in_memory_images": len(self.in_memory),
                                "in_memory_bytes": self.in_memory.nbytes},
                "compute": vars(compute),
                "real_run": {**real.to_dict(), **input_cost(compute.step_s, real.to_dict()), "cold": cold.dropped,
                             "cold_note": cold.note},
                "cached_run": {**cached.to_dict(), **input_cost(compute.step_s, cached.to_dict())},
            },
            # the step in the real run against the step alone: what the Loader's host work cost the step itself
            "step_slowdown": _slowdown(real.to_dict()["step_s"]["mean"], compute.step_s),
        }
        if self.accelerator is not None:
            out["accelerator"] = self._device(self.accelerator, prep, storage, real)
        if compare == "torch":
            ph.drop_page_cache(self.paths)
            labels = [int(x) for x in self.reader.labels()]
            files = [(str(path), label) for path, label in zip(self.paths, labels, strict=True)]
            loader = torch_dataloader(files, batch_size=batch, image_size=self.image_size, workers=self.threads)
            torch_run = self.timed("6 torch DataLoader", loader).to_dict()
            out["compare"] = {"torch": {**torch_run, **input_cost(compute.step_s, torch_run),
                                        "transform": transform_label()}}
        return out

    def _device(self, device: SimAccelerator, prep: list[Any], storage: Any, real: Any) -> dict[str, Any]:
        """The simulated device's verdict: the stall predicted from the loader's stand-alone rate, and measured."""
        rate = device.images_per_s
        at_threads = [p.images_per_s for p in prep if p.threads == self.threads] or [prep[-1].images_per_s]
        loader_rate = min(at_threads[0], storage.warm_files_per_s)
        return {"name": str(device), "images_per_s": rate, "loader_images_per_s": loader_rate,
                "predicted_stall": max(0.0, 1 - loader_rate / rate), "measured_stall": real.stall_share}

    def _conclusions(self, out: dict[str, Any], max_side: int | None) -> dict[str, Any]:
        real, cached = self.real, self.cached
        stalls = differential_stalls(self.compute.step_s, cached.wall_s / cached.batches, real.wall_s / real.batches,
                                     real.stall_share, real.verdict, fallback=real.bottleneck,
                                     fallback_shares=(real.fetch_stall_share, real.prep_stall_share))
        memory = psutil.virtual_memory()
        observed = Observed.from_run(out["phases"]["real_run"], self.threads)
        return {"stalls": vars(stalls),
                "what_if": what_ifs(batch_size=self.batch, cores=self.cores, observed=observed,
                                    prep_points=[(p.threads, p.images_per_s) for p in self.prep],
                                    dataset_bytes=sum(p.stat().st_size for p in self.paths),
                                    available_bytes=memory.available, total_bytes=memory.total, paths=self.paths,
                                    max_side=max_side or round(self.image_size * 256 / 224),
                                    crop_size=self.image_size)}

    def _verify(self, out: dict[str, Any], which: Verify) -> dict[str, Any]:
        pick = chosen(out["what_if"], which)
        if isinstance(pick, str):
            return {"what_if": None, "note": pick}
        name, setting, predicted = pick
        with tempfile.TemporaryDirectory(prefix="stallfree-verify-") as folder:
            source: Any = self.data
            settings = dict(setting)
            if name == "max_side":
                rows = min(len(self.reader), self.batch * (self.batches + 2))
                source = resized_copy(self.reader, rows, settings.pop("max_side"), Path(folder))
            cold = ph.drop_page_cache(ph.dataset_files(source))
            run = self.timed(f"7 verify {name}", self.loader(source, **settings))
        return {**verdict_of(name, setting, predicted, out["phases"]["real_run"], run.to_dict(), self.batch),
                "cold": cold.dropped, "cold_note": cold.note}
