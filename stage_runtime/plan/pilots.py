"""The host overhead fitted from the trainer's own jobs (pilots), for the model and machine they ran on.

The calibration (:mod:`.calibrate`) measures torch's schedule runtime on a near-empty pipeline: one tiny layer
per stage, so nothing else wants the cores while the runtime's Python runs. In a job the same runtime costs more:
the other stage process computes on the other core while this one posts its sends, gloo's threads copy the
messages on the same cores, and a layer runs colder than when the partitioner times it alone (best of 3, hot
caches). On this 2-core machine a job's actions took 1.1-1.4x their partitioner time plus the calibrated overhead,
and its gaps between actions 2-4x the calibrated gap (docs/plan.md, "Pilots"). A few short jobs of the model
itself, with the schedules the prediction is for, show those costs where they are paid.

From pilot jobs' output folders (what ``stallfree train`` writes: ``summary.json`` with the job's config, split
and rank 0's layer costs, ``train.jsonl`` and every rank's ``spans-{rank}.json``), per family of schedules
(:data:`~.calibration.FAMILIES`, one runtime each):

1. :func:`~.attribution.fit_overhead` over the family's jobs' spans: each action kind's busy time beyond its
   stage's compute, the gap between actions, the sender's cost of a send and the receiver's of a message, and
   the delay of a message its reader waited for beyond the link's latency (``wire_s``: torch's 1F1B waits for
   the next forward's receive with the last backward's send, and its messages took twice GPipe's at S = 4).
2. Two costs the spans do not show, from the jobs' measured schedule steps: a set-up per step (``step_s``, idle on
   every rank) and an idle after every action beyond the gap the spans show (added to ``gap_s``). Each pilot
   configuration gives one equation: its measured step (the median over its runs of each run's median step: a
   burst of load during a pilot's few steps would otherwise be fitted as overhead every cell pays) less the
   simulated one (as the trainer times it: :func:`~.books.predicted_books`' step) with the overhead of 1 =
   ``step_s`` + (the simulated step's growth per second of gap, read at the extra gap fitted: secant rounds until
   the fit settles) x the extra gap; least squares
   over the configurations, both at least 0. Pilots of few and of many micro-batches tell the two apart: a set-up
   per step weighs alike on both, an idle per action grows with the actions on the critical path.

The link is given (the calibration's, measured from sends): the pilots fit what the host adds to it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.layer_times import LayerTimes

from .attribution import Measured, fit_overhead, trainer_steps
from .books import known_costs, predicted_books
from .calibration import FAMILIES
from .costs import Cores, HostOverhead, Link, StageCost
from .orders import Op, job_program
from .simulate import simulate

__all__ = ["Pilot", "PilotFit", "fit_pilots", "mean_step", "measured_step", "read_pilot"]

_PROBE_S = 1e-4  # the least extra gap at which the simulated step's growth per second of gap is read
_ROUNDS = 8  # secant rounds of the extra gap's fit at most
_SETTLED_S = 1e-6  # the extra gap's fit has settled when a round moves it less than this


@dataclass(frozen=True)
class Pilot:
    """One finished job, as the fit reads it."""

    out_dir: str
    model: str
    schedule: str
    stages: int
    microbatches: int
    program: dict[int, list[Op]]  # what each rank ran (torch's order)
    owner: tuple[int, ...]
    costs: tuple[StageCost, ...]  # per model stage, from the layer costs rank 0 measured
    step_s: float  # the median schedule step after the first
    steps: tuple[tuple[Any, ...], ...]  # the spans of each step after the first

    @property
    def config_key(self) -> tuple[str, str, int, int]:
        """What makes two pilots runs of the same configuration."""
        return self.model, self.schedule, self.stages, self.microbatches

    def measured(self) -> Measured:
        """As :func:`~.attribution.fit_overhead` takes it."""
        return Measured([list(s) for s in self.steps], self.owner, self.costs)


def _logged_steps(out_dir: str | Path) -> list[dict[str, Any]]:
    """A job's logged steps after the first (all of them if there is one), from its ``train.jsonl``."""
    path = Path(out_dir) / "train.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (stallfree train writes one per job)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "loss" in r]
    if not steps:
        raise ValueError(f"{path}: no training step logged")
    return steps[1:] or steps


def measured_step(out_dir: str | Path) -> tuple[float, float]:
    """Median schedule step seconds and bubble over a job's steps after the first, from its ``train.jsonl``.

    The schedule's step (``compute_step_s``), not the row's ``step_s``: that adds stage 0's wait for its next
    batch, which the simulated step, the schedule alone, does not hold; the bubble is the schedule's too.

    Raises:
        FileNotFoundError: no ``train.jsonl``.
        ValueError: no step in it.
    """
    steps = _logged_steps(out_dir)
    return statistics.median(r["compute_step_s"] for r in steps), statistics.median(r["bubble"] for r in steps)


def mean_step(out_dir: str | Path) -> float:
    """The mean schedule step seconds over a job's steps after the first: what a job pays on this machine.

    The median leaves out the steps that met a busy moment (another process's time slice, 2-20 ms here); a job's
    time, and the books that split it, pay them. Errors as :func:`measured_step`.
    """
    return statistics.fmean(r["compute_step_s"] for r in _logged_steps(out_dir))


def read_pilot(out_dir: str | Path) -> Pilot:
    """A finished job's configuration, split, layer costs, measured step and spans.

    Raises:
        FileNotFoundError: a file the job should have written is missing (the message names it).
        ValueError: its summary has no layer costs (a job given ``--balance`` measures none), it ran with
            ``--link-delay``, or its spans do not match its schedule.
    """
    out = Path(out_dir)
    path = out / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; a pilot is the --out folder of a finished stallfree train")
    summary = json.loads(path.read_text())
    layers = summary.get("layer_costs")
    if not layers:
        raise ValueError(f"{path}: no layer costs (a job given --balance measures none); run the pilot without "
                         "--balance")
    try:
        config = TrainConfig.from_flags(**summary["config"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: its 'config' is not a stallfree train job's ({err})") from None
    delay = config.simulation.link_delay
    if delay is not None:  # its spans would fit the delayed messages' waits as the runtime's overhead
        raise ValueError(f"{path}: a job run with --link-delay {delay} waits for its delayed messages, which is no "
                         "overhead of torch's runtime; give pilots run without --link-delay")
    program, owner = job_program(config)
    costs = known_costs(config, [LayerTimes(**c) for c in layers["layers"]], summary["balance"],
                        float(layers["optimizer_s"]))  # under sim:R, the device's known times
    p = config.pipeline
    return Pilot(str(out), config.model.name, p.schedule, p.stages, p.microbatches, program,
                 tuple(owner), tuple(costs), measured_step(out)[0],
                 tuple(tuple(s) for s in trainer_steps(out, program)))


def _simulated_s(pilot: Pilot, link: Link, overhead: HostOverhead, cores: Cores | None) -> float:
    """The simulated step as the trainer times it (the books' step), to set beside ``pilot.step_s``.

    The trainer times the pipeline's step whole, to the last compute action on any rank (under the zero-bubble
    schedules the other ranks' weight gradients after rank 0's last action included), and so does the books' step;
    the simulated schedule's own end also counts its optimizer steps, which the trainer times apart.
    """
    result = simulate(pilot.program, pilot.owner, pilot.costs, lambda a, b: link, overhead=overhead, cores=cores)
    return predicted_books(result, pilot.program, pilot.owner, pilot.costs, 1).step_s


def _non_negative_fit(rows: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``(a, b) >= 0`` minimising the squares of ``y - a - d * b`` over ``rows`` of ``(d, y)``."""
    ys = [y for _, y in rows]
    mean_y = statistics.fmean(ys)
    ds = [d for d, _ in rows]
    mean_d = statistics.fmean(ds)
    spread = sum((d - mean_d) ** 2 for d in ds)
    if spread > 0:
        b = sum((d - mean_d) * (y - mean_y) for d, y in rows) / spread
        a = mean_y - b * mean_d
        if a >= 0 and b >= 0:
            return a, b
    # On the boundary: the better of a alone (b = 0) and b alone (a = 0).
    square = sum(d * d for d in ds)
    b_only = max(0.0, sum(d * y for d, y in rows) / square) if square > 0 else 0.0
    a_only = max(0.0, mean_y)
    error_a = sum((y - a_only) ** 2 for y in ys)
    error_b = sum((y - b_only * d) ** 2 for d, y in rows)
    return (a_only, 0.0) if error_a <= error_b else (0.0, b_only)


@dataclass(frozen=True)
class PilotFit:
    """The host overhead pilots showed: per schedule that had pilots of its own, and per family of schedules."""

    schedules: dict[str, HostOverhead]  # fitted from that schedule's pilots alone
    families: dict[str, HostOverhead]  # fitted from every pilot of the family (:data:`~.calibration.FAMILIES`)

    def overhead(self, schedule: str) -> HostOverhead | None:
        """The schedule's own fit, else its family's; None if no pilot ran either."""
        return self.schedules.get(schedule) or self.families.get(FAMILIES.get(schedule, ""))

    def source(self, schedule: str) -> str:
        """Which pilots :meth:`overhead` took for ``schedule``: ``schedule``, ``family`` or ``none``."""
        if schedule in self.schedules:
            return "schedule"
        return "family" if FAMILIES.get(schedule) in self.families else "none"

    def to_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {"schedules": {k: v.to_dict() for k, v in self.schedules.items()},
                "families": {k: v.to_dict() for k, v in self.families.items()}}


def _fit(pilots: Sequence[Pilot], link: Link, cores: Cores | None) -> HostOverhead:
    """One overhead for ``pilots`` (see the module docstring)."""
    overhead, latency_s = fit_overhead([p.measured() for p in pilots], link)
    # what the schedule adds to the link for a message its reader waits for (the link: the near-empty GPipe's)
    overhead = replace(overhead, wire_s=max(0.0, latency_s - link.latency_s))
    configs: dict[tuple[str, str, int, int], list[Pilot]] = {}
    for p in pilots:
        configs.setdefault(p.config_key, []).append(p)
    firsts = [runs[0] for runs in configs.values()]
    short = []  # per configuration, the median of its runs' measured step less the simulated one
    base = []  # per configuration, its first run's simulated step
    for runs in configs.values():
        simulated = [_simulated_s(p, link, overhead, cores) for p in runs]
        short.append(statistics.median(p.step_s - s for p, s in zip(runs, simulated, strict=True)))
        base.append(simulated[0])
    # The step grows faster than linearly with the gap (more of the actions' gaps land on the critical path as
    # they grow: small_cnn's GPipe over 4 ranks at M = 8 grew 28% faster at 0.9 ms than at 0.1 ms), so the growth
    # per second of gap is read again at the extra gap just fitted (a secant) until the fit stands still.
    extra_gap_s, step_s = _PROBE_S, 0.0
    for _ in range(_ROUNDS):
        wider = replace(overhead, gap_s=overhead.gap_s + max(extra_gap_s, _PROBE_S))
        growth = [(_simulated_s(p, link, wider, cores) - b) / (wider.gap_s - overhead.gap_s)
                  for p, b in zip(firsts, base, strict=True)]
        step_s, fitted = _non_negative_fit(list(zip(growth, short, strict=True)))
        if abs(fitted - extra_gap_s) < _SETTLED_S:
            extra_gap_s = fitted
            break
        extra_gap_s = fitted
    return replace(overhead, step_s=step_s, gap_s=overhead.gap_s + extra_gap_s)


def fit_pilots(pilots: Sequence[Pilot], link: Link, cores: Cores | None = None) -> PilotFit:
    """The host overhead ``pilots`` show, per schedule among them and per family (see the module docstring).

    torch runs each schedule its own way even within a family (1F1B posts the next forward's receive with the
    previous backward's send, GPipe when it gets there), so a schedule with pilots of its own is predicted from
    them; one without, from its family's. ``link`` is the one predictions will use; ``cores`` the sharing they will
    simulate (as :func:`~.predict.predict_training` does), so that the fitted costs are what is left beside them.
    Runs of one configuration (``Pilot.config_key``) count as one equation, with the median of their steps.

    Raises:
        ValueError: no pilot, or pilots of different models or rank counts (the fit is for one of each).
    """
    if not pilots:
        raise ValueError("fitting the host overhead from pilots needs at least one pilot job")
    kinds = {(p.model, p.stages) for p in pilots}
    if len(kinds) > 1:
        raise ValueError(f"pilots of one model and rank count fit one overhead; got {sorted(kinds)} "
                         f"({', '.join(p.out_dir for p in pilots)})")
    schedules = {s: _fit([p for p in pilots if p.schedule == s], link, cores)
                 for s in dict.fromkeys(p.schedule for p in pilots)}
    families = {f: _fit([p for p in pilots if FAMILIES[p.schedule] == f], link, cores)
                for f in dict.fromkeys(FAMILIES[p.schedule] for p in pilots)}
    return PilotFit(schedules, families)
