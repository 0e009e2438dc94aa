"""``stallfree.plan``: every schedule simulated for a model and a set of devices, ranked, from Python.

What ``stallfree plan`` does, as a function: the layer costs (measured here with the partitioner's measurement, or
read from a costs file), the host overhead (:mod:`.overhead`: pilots, a calibration, or none), every synchronous
configuration ranked (:func:`~.planner.rank_plans`), and the asynchronous schedules beside the best 1F1B plan.
:meth:`PlanResult.write` lays out ``plan.json`` (:mod:`.handoff`, which ``stallfree train --plan`` reads) and
``timeline.png``; the command only parses, calls and prints.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch

from stallfree.core.atomic import atomic_write
from stallfree.stage_runtime.config.train_config import TOKEN_MODELS
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.models.measure import measure_model
from stallfree.stage_runtime.models.zoo import build_model
from stallfree.stage_runtime.processes import stage_threads
from stallfree.stage_runtime.schedules import schedule_spec

from .asynchronous import ASYNC_SCHEDULES, AsyncResult, simulate_async
from .calibration import read_calibration
from .costs import DEFAULT_LINK, Cores, Link, layers_from_json, parse_bytes, parse_link, scale_layers
from .handoff import plan_document
from .overhead import OverheadChoice
from .pilots import fit_pilots, read_pilot
from .planner import SYNC_SCHEDULES, Candidate, Network, rank_plans
from .timeline import draw_timeline

__all__ = ["PlanResult", "plan"]

_PILOT_SOURCES = {"schedule": "from its pilots", "family": "from its family's", "none": "without"}


@dataclass(frozen=True)
class PlanResult:
    """Every configuration simulated, fastest first (those within the memory limit before the others)."""

    model: str
    image_size: int
    classes: int
    batch_size: int
    network: Network
    memory_limit: int | None  # bytes per device
    cores: Cores | None  # the cores the ranks share; None: a device each
    costs: dict[str, Any]  # where the layer costs came from (plan.json's ``costs``)
    layers: int
    optimizer_s: float
    calibration: dict[str, Any] | None  # the calibration used, with ``describe``; None: none given
    pilots: dict[str, Any] | None  # the pilots' fits, with ``describe``; None: none given
    candidates: tuple[Candidate, ...]
    skipped: tuple[str, ...]  # configurations torch refuses, with the reason
    reference: Candidate | None  # the best 1F1B plan within memory, the asynchronous schedules' reference
    asynchronous: tuple[AsyncResult, ...]  # simulated beside ``reference``

    @property
    def best(self) -> Candidate:
        """The first of :attr:`candidates`."""
        return self.candidates[0]

    @property
    def train_command(self) -> str:
        """The ``stallfree train`` command that runs :attr:`best`."""
        best = self.best
        return (f"stallfree train DATA --model {self.model} --image-size {self.image_size} --batch-size "
                f"{self.batch_size} --schedule {best.schedule} --stages {best.ranks} --microbatches "
                f"{best.microbatches} --balance {','.join(map(str, best.balance))}"
                + (f" --virtual-stages {best.virtual}" if schedule_spec(best.schedule).stages_fixed is None else ""))

    def to_dict(self) -> dict[str, Any]:
        """As ``plan.json`` holds it (:func:`~.handoff.plan_document`)."""
        return plan_document(self)

    def write(self, out: str | Path) -> tuple[Path, Path]:
        """Write ``plan.json`` and ``timeline.png`` (the best plan's step) under ``out``; returns their paths."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "plan.json", json.dumps(self.to_dict(), indent=1).encode())
        best = self.best
        png = draw_timeline(best.result, out / "timeline.png",
                            f"{best.schedule}, {best.ranks} ranks x {best.virtual} stages, {best.microbatches} "
                            f"micro-batches, balance {','.join(map(str, best.balance))}: step "
                            f"{best.result.step_s * 1e3:.3f} ms, bubble {best.result.bubble_share:.0%} (predicted)",
                            books=best.books())
        return out / "plan.json", png


def _check(image_size: int, classes: int, batch_size: int, devices: int, top: int, threads: int | None,
           cores: int | None, schedules: Sequence[str], microbatches: Sequence[int], costs: Path | None,
           calibration: Path | None, pilots: Sequence[Path]) -> None:
    named = {"image_size": image_size, "classes": classes, "batch_size": batch_size, "devices": devices, "top": top}
    for name, value in named.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if devices < 2:
        raise ValueError(f"--devices must be >= 2 to split a model into a pipeline, got {devices}")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    if cores is not None and cores < 1:
        raise ValueError(f"--cores must be >= 1, got {cores}; leave it out to give each rank a device")
    unknown = [s for s in schedules if s not in SYNC_SCHEDULES]
    if unknown:
        raise ValueError(f"--schedules: unknown {', '.join(unknown)}; choose from {', '.join(SYNC_SCHEDULES)}")
    if not any(batch_size % m == 0 for m in microbatches):
        raise ValueError(f"--microbatches {','.join(map(str, microbatches))}: none divides --batch-size "
                         f"{batch_size}")
    if costs is not None and not costs.is_file():
        raise FileNotFoundError(f"--costs {costs}: no such file")
    if calibration is not None and not calibration.is_file():
        raise FileNotFoundError(f"--calibration {calibration}: no such file")
    for folder in pilots:
        if not folder.is_dir():
            raise FileNotFoundError(f"--pilots {folder}: no such folder")


def _calibration(path: Path, choice: OverheadChoice) -> dict[str, Any]:
    """What was used, for plan.json: the file, a line saying it, and which calibration each rank count took."""
    found = choice.calibrations
    link = found[min(found)].link
    describe = (f"{path} (measured on {', '.join(map(str, sorted(found)))} processes; a plan of S ranks takes the "
                f"nearest; link {link.describe()})")
    return {"file": str(path), "describe": describe, "ranks": sorted(found), "used": choice.used,
            "calibrations": {str(r): c.to_dict() for r, c in found.items()}}


def _pilots(folders: Sequence[Path], model: str | None, schedules: Sequence[str], calibrated: bool,
            link: Link, cores: Cores | None, choice: OverheadChoice) -> tuple[dict[str, Any], OverheadChoice]:
    """(what was used, for plan.json; ``choice`` with the pilots' fits): ``model`` None takes any model's pilots."""
    if not folders:
        return {}, choice
    pilots = [read_pilot(folder) for folder in folders]
    models = sorted({p.model for p in pilots})
    if model is not None and models != [model]:
        raise ValueError(f"--pilots ran {', '.join(models)}, not --model {model}: pilots fit the overhead of "
                         "the model they ran")
    by_ranks: dict[int, list[Any]] = {}
    for p in pilots:
        by_ranks.setdefault(p.stages, []).append(p)
    fits = {ranks: fit_pilots(mine, link, cores) for ranks, mine in sorted(by_ranks.items())}
    runs = ", ".join(f"{p.schedule} S={p.stages} M={p.microbatches}" for p in pilots)
    other = "--calibration's" if calibrated else "no host overhead"
    sources = "; ".join(
        f"S={r}: " + ", ".join(f"{s} {_PILOT_SOURCES[fit.source(s)]}" for s in schedules)
        for r, fit in fits.items())
    describe = (f"host overhead fitted from {len(pilots)} pilot job(s) ({runs}); {sources} ({other} where "
                f"no pilot of the family ran, and for other rank counts)")
    return ({"folders": [str(f) for f in folders], "describe": describe,
             "fits": {str(r): f.to_dict() for r, f in fits.items()}},
            OverheadChoice(choice.calibrations, fits, choice.used))


def _layer_source(model: str, costs: Path | None, image_size: int, classes: int, batch_size: int,
                  device: str | None, progress: Callable[[str], object] | None,
                  ) -> tuple[Callable[[int], Sequence[LayerTimes]], float, dict[str, Any]]:
    """(micro-batch size -> layer costs, optimizer seconds, how they were obtained)."""
    if costs is not None:
        layers, micro, optimizer_s = layers_from_json(costs)
        return (lambda b: scale_layers(layers, b / micro)), optimizer_s, {"source": str(costs), "microbatch": micro}
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    built = build_model(model, classes, image_size)
    optimizer = []

    @cache
    def layers_for(micro: int) -> list[LayerTimes]:
        if progress is not None:
            progress(f"measuring {model}'s {len(built)} layers on {device} at micro-batch {micro}")
        layers, opt = measure_model(built, image_size, micro, device)
        optimizer.append(opt)
        return layers

    layers_for(batch_size)
    return layers_for, optimizer[0], {"source": "measured", "device": device, "threads": torch.get_num_threads()}


def plan(model: str = "small_cnn", *, costs: str | Path | None = None, image_size: int = 32, classes: int = 10,
         batch_size: int = 32, devices: int = 2, sites: int | None = None, link: Link | str | None = None,
         cross_link: Link | str | None = None, memory_per_device: int | str | None = None,
         calibration: str | Path | None = None, pilots: Sequence[str | Path] = (),
         schedules: Sequence[str] | None = None, microbatches: Sequence[int] = (1, 2, 4, 8, 16, 32),
         virtual_stages: Sequence[int] = (2, 4), device: str | None = None, threads: int | None = None,
         cores: int | None = None, top: int = 5, asynchronous: bool = True,
         progress: Callable[[str], object] | None = None) -> PlanResult:
    """Simulate one training step of every configuration of ``model`` on ``devices`` and rank them.

    The arguments are ``stallfree plan``'s flags (docs/plan.md): ``link``, ``cross_link`` and
    ``memory_per_device`` take their strings (``"25GB/s,5us"``, ``"16GiB"``) or typed values (a ``Link``, bytes).
    ``costs``: per-layer costs from a JSON file instead of measuring ``model`` on ``device`` (default cuda when
    available) with ``threads`` torch threads (default: cores / devices, as the trainer gives each stage process).
    ``calibration``: ``stallfree bench plan``'s JSON; ``pilots``: ``stallfree train`` output folders of this model
    (:mod:`.overhead` says which host overhead each plan is charged). ``schedules``: default all synchronous ones.
    ``cores``: the ranks are processes sharing that many CPU cores. ``progress`` gets a line per measurement.

    Raises:
        ValueError: an argument out of range or unreadable, pilots of another model, nothing to simulate.
        FileNotFoundError: ``costs``, ``calibration`` or a pilot folder missing.
    """
    costs = None if costs is None else Path(costs)
    calibration = None if calibration is None else Path(calibration)
    folders = [Path(p) for p in pilots]
    names = list(SYNC_SCHEDULES if schedules is None else schedules)
    if model in TOKEN_MODELS:  # its stage 0 takes packed token rows, which the planner's measurement does not make
        raise ValueError(f"--model {model} is a token model; stallfree plan measures image models (train it with "
                         f"stallfree train --model {model}, whose summary holds its books and the simulator's "
                         "prediction)")
    _check(image_size, classes, batch_size, devices, top, threads, cores, names, microbatches, costs, calibration,
           folders)
    choice = OverheadChoice() if calibration is None else OverheadChoice(read_calibration(calibration))
    if isinstance(link, str):
        link = parse_link(link) if link else None
    if link is None and choice.calibrations:
        link = choice.calibrations[min(choice.calibrations)].link  # two processes' ping-pong: the least contended
    link = link or parse_link(DEFAULT_LINK)
    if isinstance(cross_link, str):
        cross_link = parse_link(cross_link, "--cross-link") if cross_link else None
    sites = sites if sites is not None else (2 if cross_link else 1)
    network = Network(devices, link, cross_link or link, sites)
    if isinstance(memory_per_device, str):
        memory_per_device = parse_bytes(memory_per_device) if memory_per_device else None
    threads = stage_threads(devices, threads, cores)
    sharing = Cores(cores, threads) if cores else None
    piloted, choice = _pilots(folders, model if costs is None else None, names, calibration is not None, link,
                              sharing, choice)
    with _measuring_threads(None if costs is not None else threads):
        layers_for, optimizer_s, source = _layer_source(model, costs, image_size, classes, batch_size, device,
                                                        progress)
        skipped: list[str] = []
        plans = rank_plans(layers_for, optimizer_s, batch_size, network, memory_per_device, names, microbatches,
                           virtual_stages, top=top, skipped=skipped, overhead=choice, cores=sharing)
    reference = next((c for c in plans if c.schedule == "1f1b" and c.fits), None)
    beside = []
    if asynchronous and reference is not None:
        beside = [simulate_async(name, reference.ranks, reference.microbatches, batch_size, reference.costs,
                                 network.between, cores=sharing) for name in ASYNC_SCHEDULES]
    return PlanResult(model, image_size, classes, batch_size, network, memory_per_device, sharing, source,
                      len(layers_for(batch_size)), optimizer_s,
                      None if calibration is None else _calibration(calibration, choice), piloted or None,
                      tuple(plans), tuple(skipped), reference, tuple(beside))


@contextmanager
def _measuring_threads(threads: int | None) -> Iterator[None]:
    """Measure on ``threads`` torch threads (the layers are measured lazily, while ranking); None: leave torch be."""
    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)  # process-wide: leave it as we found it
