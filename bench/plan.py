"""The planner's predictions against the trainer's measurements: step time and bubble for every synchronous schedule.

For each bundled model (``--models``), pipeline ranks (``--stages``) and micro-batch count (``--microbatches``),
every synchronous schedule torch accepts is trained for ``--steps`` steps on generated tensors (no input cost) in
one set of stage processes per rank count, on gloo, and its measured step time and bubble (medians over the steps
after the first) are set beside the simulator's prediction for the same split (``stallfree.stage_runtime.plan
.predict``, from the layer costs rank 0 measured). Every job runs ``--repeats`` times, the jobs taking turns (so
a slow minute of a shared machine falls on several cells, not on every run of one), and a cell gives the medians
of its runs' measurements and of their predictions. Before each rank count's jobs, that many gloo processes
calibrate the simulator on this machine (``stage_runtime/plan/calibrate.py``): the link's bandwidth from measured
sends and its latency from a near-empty pipeline's messages (unless ``--link`` gives one), and the host overhead
of torch's schedule runtime per action kind, gap, send, receive and step from that pipeline's spans (unless
``--no-overhead``). That pipeline computes almost nothing, and a job's runtime costs more than it shows, so
by default pilot jobs of each model refit the host overhead (``stage_runtime/plan/pilots.py``): each of
``--pilot-schedules`` (default: every schedule) at its fewest and most micro-batches, run again in every turn
beside the cells; a schedule is predicted from its own pilots' fit, one without from its family's. The table marks
the cells whose configuration a pilot also ran (in runs of its own) and counts the others apart, and gives the
count the calibration alone reaches on the same runs (``--no-pilots`` predicts from it). The stage processes
share this machine's cores, and so do the simulated ranks (processor sharing, ``stage_runtime/plan/costs.py``'s
``Cores``; unless ``--no-sharing``). The table says, per cell,
whether the step is within 15% and the bubble within 5 points, and the count of cells that are; then, per model,
whether the simulator's top choice among the cells run (the fastest predicted) is within 10% of the fastest
measured; then, per cell, what the job's spans show per action kind, per message and per send beside the
simulated step's (``stage_runtime/plan/attribution.py``). The load averages at the start and the end say how
busy the machine was.

With ``--accelerator sim:R`` every cell trains on the simulated device (each stage's compute a wait of known
length, ``stage_runtime/stage_times.py``) and is predicted with those known times, so only the host runtime and
the communication are left to predict (the calibration and the pilots fit them as without it). A further table
sets each cell's books (``stage_runtime/plan/books.py``) measured beside predicted, part by part, and counts the
cells whose step (the pipeline's, timed whole) is within 10% and every part of every rank within 3 points, with
what misses.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from .plan_report import (
    BUBBLE_POINTS,
    STEP_TOLERANCE,
    Sweep,
    books_cell,
    link_source,
    print_attribution,
    print_books,
    print_cells,
    print_load,
    print_overheads,
    top_choices,
)

__all__ = ["EXAMPLES", "add_arguments", "run", "top_choices"]

EXAMPLES = """examples:
  stallfree bench plan                                     # mlp and small_cnn, S 2 and 4, M 2, 4, 8
  stallfree bench plan --models mlp --stages 2 --microbatches 4 --steps 6 --repeats 1
  stallfree bench plan --link 1GB/s,2ms --json-file bench-plan.json   # a given link instead of the calibration
  stallfree bench plan --no-overhead                       # the simulator without torch's runtime overhead
  stallfree bench plan --stages 4 --no-sharing             # predict as if each stage process had its own cores
  stallfree bench plan --stages 2 --pilot-schedules gpipe interleaved-1f1b zero-bubble   # 1F1B, ZBV by family
  stallfree bench plan --no-pilots                         # the near-empty pipeline's calibration alone
  stallfree bench plan --accelerator sim:400 --models small_cnn --repeats 2   # compute known: the books part by part
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    # no torch import for --help; the schedules are the synchronous ones (the planner ranks them; 2bw apart)
    from stallfree.core.accelerator import parse_accelerator
    from stallfree.stage_runtime.schedules import FLUSHING as SCHEDULES

    parser.add_argument("--models", nargs="+", choices=("mlp", "small_cnn"), default=["mlp", "small_cnn"],
                        help="bundled models to plan and train")
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES),
                        help="synchronous schedules")
    parser.add_argument("--stages", nargs="+", type=int, default=[2, 4], help="pipeline ranks to try")
    parser.add_argument("--microbatches", nargs="+", type=int, default=[2, 4, 8], help="micro-batch counts")
    parser.add_argument("--steps", type=int, default=8, help="steps per job (the first is not counted)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every job, taking turns (a cell gives the "
                        "medians of its runs)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per step")
    parser.add_argument("--image-size", type=int, default=16, help="side of the generated images")
    parser.add_argument("--link", help="BANDWIDTH,LATENCY instead of the calibration, e.g. 1GB/s,2ms")
    parser.add_argument("--no-overhead", action="store_true",
                        help="predict without the calibrated per-action, per-message and per-step host overhead")
    parser.add_argument("--pilot-schedules", nargs="+", choices=SCHEDULES, default=None,
                        help="schedules whose pilot jobs (the fewest and most --microbatches, run again beside the "
                        "cells) fit the host overhead: each schedule with pilots is predicted from its own, one "
                        "without from its family's (default: every --schedules)")
    parser.add_argument("--no-pilots", action="store_true",
                        help="predict with the near-empty pipeline's calibration alone")
    parser.add_argument("--accelerator", type=parse_accelerator, default=None, metavar="sim:R",
                        help="train every cell on the simulated device of R images/s (each stage's compute a wait of "
                        "known length) and predict with those known times: only the host runtime and the "
                        "communication are left to predict; the table then compares the step (within 10%%) and "
                        "each part of the books (within 3 points)")
    parser.add_argument("--no-sharing", action="store_true",
                        help="predict as if each stage process had cores of its own (by default the simulated ranks "
                        "share this machine's cores as the stage processes do)")


def _jobs(args: argparse.Namespace, stages: int, out: Path) -> tuple[list[Any], list[str]]:
    from stallfree.stage_runtime.config.train_config import TrainConfig
    from stallfree.stage_runtime.plan.orders import torch_order
    from stallfree.stage_runtime.schedules import schedule_spec
    from stallfree.stage_runtime.train.preflight import check

    configs, skipped = [], []
    for model in args.models:
        for schedule in args.schedules:
            for m in args.microbatches:
                spec = schedule_spec(schedule)
                try:
                    if args.batch_size % m:
                        raise ValueError(f"{m} does not divide --batch-size {args.batch_size}")
                    spec.check(stages, m)
                    torch_order(schedule, stages, m)  # what torch itself refuses, e.g. 1F1B with M < S
                except ValueError as err:
                    skipped.append(f"{model} {schedule} S={stages} M={m}: {err}")
                    continue
                config = TrainConfig.from_flags(
                    model=model, image_size=args.image_size, samples=args.batch_size * (args.steps + 1),
                    stages=stages, schedule=schedule, microbatches=m, batch_size=args.batch_size,
                    max_steps=args.steps, progress=False, accelerator=args.accelerator,
                    out_dir=str(out / f"{model}-{schedule}-s{stages}-m{m}"))
                try:
                    check(config)  # e.g. more model stages than the model has layers: said, not a failed sweep
                except ValueError as err:
                    skipped.append(f"{model} {schedule} S={stages} M={m}: {err}")
                    continue
                configs.append(config)
    return configs, skipped


def _pilot_jobs(configs: list[Any], schedules: Sequence[str]) -> list[Any]:
    """The jobs a pilot repeats: per model, each of ``schedules`` at its fewest and most micro-batches."""
    out = []
    for model in dict.fromkeys(c.model.name for c in configs):
        for schedule in schedules:
            mine = [c for c in configs if c.model.name == model and c.pipeline.schedule == schedule]
            if mine:
                ends = {min(c.pipeline.microbatches for c in mine), max(c.pipeline.microbatches for c in mine)}
                out += [c for c in mine if c.pipeline.microbatches in ends]
    return out


def _predicted(config: Any, summary: dict[str, Any], link: Any, overhead: Any, share_cores: bool) -> dict[str, Any]:
    """The simulator's prediction for one run of a job, from the layer costs its rank 0 measured."""
    from stallfree.stage_runtime.models.layer_times import LayerTimes
    from stallfree.stage_runtime.plan.predict import predict_training

    costs = summary.get("layer_costs")
    measured = None if costs is None else ([LayerTimes(**c) for c in costs["layers"]], float(costs["optimizer_s"]))
    return predict_training(config, tuple(summary["balance"]), summary["num_classes"], link, overhead,
                            measured=measured, share_cores=share_cores)


def _row(config: Any, summary: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """One run of a cell: measured (train.jsonl and the spans) beside ``predicted`` (:func:`_predicted`)."""
    from stallfree.stage_runtime.plan.attribution import attribute, trainer_steps
    from stallfree.stage_runtime.plan.orders import job_program
    from stallfree.stage_runtime.plan.pilots import mean_step, measured_step

    step_s, bubble = measured_step(config.report.out_dir)
    order, owner = job_program(config)
    shown = attribute(trainer_steps(config.report.out_dir, order), owner)
    p, out = config.pipeline, config.report.out_dir
    return {"model": config.model.name, "schedule": p.schedule, "stages": p.stages,
            "microbatches": p.microbatches, "balance": summary["balance"],
            "measured_step_s": step_s, "measured_bubble": bubble, "measured_mean_step_s": mean_step(out),
            "cores": predicted["cores"],
            "measured_spans": shown.to_dict(), "measured_books": summary.get("books"), **_prediction(predicted)}


def _prediction(predicted: dict[str, Any]) -> dict[str, Any]:
    """A row's predicted fields from :func:`_predicted`'s result."""
    return {"predicted_step_s": predicted["step_s"], "predicted_bubble": predicted["bubble"],
            "predicted_spans": {k: predicted[k] for k in ("per_action_s", "per_message_s", "send_s")},
            "predicted_books": predicted["books"]}


def _median_cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell from its runs: the medians of the measured and of the predicted step and bubble.

    Each run's prediction is from the layer costs that run measured; the spans shown are the first run's.
    """
    row = dict(runs[0])
    for key in ("measured_step_s", "predicted_step_s", "measured_bubble", "predicted_bubble"):
        row[key] = statistics.median(r[key] for r in runs)
    row["runs_step_s"] = [r["measured_step_s"] for r in runs]
    row["runs_spread"] = max(row["runs_step_s"]) / min(row["runs_step_s"])
    row["step_error"] = row["predicted_step_s"] / row["measured_step_s"] - 1
    row["within"] = (abs(row["step_error"]) <= STEP_TOLERANCE
                     and abs(row["predicted_bubble"] - row["measured_bubble"]) <= BUBBLE_POINTS)
    if all(r.get("measured_books") for r in runs):
        row.update(books_cell(runs))
    return row


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    from stallfree.stage_runtime.plan.costs import parse_link

    _check(args)
    given = parse_link(args.link) if args.link else None
    load_start = os.getloadavg()
    sweep = Sweep()
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-plan-") as tmp:
        for stages in args.stages:
            _run_stages(args, stages, Path(tmp), given, sweep)
    load_end = os.getloadavg()
    print_load(load_start, load_end, out)
    print_overheads(args, given, sweep, out)
    result = print_cells(args, sweep.rows, out)
    if args.accelerator is not None:
        result["books"] = print_books(args, sweep.rows, out)
    for reason in sweep.skipped:
        print(f"skipped {reason}", file=out)
    print_attribution(sweep.rows, out)
    return {"load_average": {"start": list(load_start), "end": list(load_end)},
            "link": given.describe() if given else None, "link_source": link_source(given),
            "accelerator": str(args.accelerator) if args.accelerator else None,
            "overhead_used": not args.no_overhead, "cores_shared": not args.no_sharing,
            "calibration": sweep.calibrations, "pilots": sweep.pilot_fits, "rows": sweep.rows, **result,
            "skipped": sweep.skipped}


def _check(args: argparse.Namespace) -> None:
    """Refuse options that cannot make a sweep, naming them."""
    if args.steps < 2 or args.batch_size < 1 or min(args.stages) < 2 or args.repeats < 1:
        raise ValueError("--steps must be >= 2, --batch-size >= 1, every --stages >= 2 and --repeats >= 1")
    stray = sorted(set(args.pilot_schedules or ()) - set(args.schedules))
    if stray:
        raise ValueError(f"--pilot-schedules {' '.join(stray)}: not among --schedules {' '.join(args.schedules)} "
                         "(a pilot repeats a cell's job)")


def _run_stages(args: argparse.Namespace, stages: int, tmp: Path, given: Any, sweep: Sweep) -> None:
    """Calibrate on ``stages`` processes, train every job of that rank count with its pilots, add its cells."""
    from stallfree.stage_runtime.jobs import train_many
    from stallfree.stage_runtime.plan.calibrate import cached_calibration
    from stallfree.stage_runtime.plan.overhead import OverheadChoice
    from stallfree.stage_runtime.plan.pilots import fit_pilots, read_pilot
    from stallfree.stage_runtime.plan.predict import job_cores

    configs, left_out = _jobs(args, stages, tmp)
    sweep.skipped += left_out
    if not configs:
        return
    runs = [[c.with_flags(out_dir=f"{c.report.out_dir}-r{k}") for c in configs] for k in range(args.repeats)]
    print(f"calibrating on {stages} gloo processes: sends and a near-empty pipeline ...", file=sys.stderr,
          flush=True)
    calibration = cached_calibration(stages, configs[0].processes.threads)
    sweep.calibrations[str(stages)] = calibration.to_dict()
    link = given or calibration.link
    print(f"training {len(configs)} jobs {args.repeats} time(s) in {stages} stage processes ...",
          file=sys.stderr, flush=True)
    pilots = [] if args.no_pilots or args.no_overhead else _pilot_jobs(configs, args.pilot_schedules or args.schedules)
    # Each turn runs the pilots again before the cells: the fit sees the machine as the cells' runs do.
    turns = [[c.with_flags(out_dir=f"{c.report.out_dir}-pilot{k}") for c in pilots] + run for k, run in enumerate(runs)]
    every = [config for turn in turns for config in turn]
    summaries = dict(zip((c.report.out_dir for c in every), train_many(every), strict=True))
    sharing = None if args.no_sharing else job_cores(configs[0])
    fitted = {model: fit_pilots([read_pilot(c.report.out_dir) for turn in turns for c in turn[:len(pilots)]
                                 if c.model.name == model], link, sharing)
              for model in dict.fromkeys(c.model.name for c in pilots)}
    sweep.pilot_fits[str(stages)] = {model: fit.to_dict() for model, fit in fitted.items()}
    piloted = {(c.model.name, c.pipeline.schedule, c.pipeline.microbatches) for c in pilots}
    calibrated = OverheadChoice({} if args.no_overhead else {stages: calibration})
    for cell in zip(*runs, strict=True):  # one cell's runs
        fit = fitted.get(cell[0].model.name)
        choice = OverheadChoice(calibrated.calibrations, {stages: fit} if fit else {})
        first = cell[0]
        key = (first.model.name, first.pipeline.schedule, first.pipeline.microbatches)
        sweep.rows.append(_cell_row(cell, summaries, link, choice, calibrated, not args.no_sharing, key in piloted))


def _cell_row(cell: Sequence[Any], summaries: dict[str, Any], link: Any, choice: Any, calibrated: Any,
              share: bool, piloted: bool) -> dict[str, Any]:
    """One cell from its runs, predicted with the host overhead ``choice`` picks.

    When that is the pilots' fit, the same runs predicted from the ``calibrated`` choice alone go beside it;
    ``piloted``: a pilot also ran the cell's configuration.
    """
    first = cell[0]
    overhead, source = choice.choose(first.pipeline.schedule, first.pipeline.stages)
    runs_of_cell = [_row(c, summaries[c.report.out_dir],
                         _predicted(c, summaries[c.report.out_dir], link, overhead, share)) for c in cell]
    row = _median_cell(runs_of_cell)
    from_pilots = source in ("schedule", "family")
    row["overhead_from"] = f"pilots ({source})" if from_pilots else "calibration"
    row["pilot_config"] = piloted
    if from_pilots:  # the same runs, predicted from the calibration alone
        alone = calibrated(first.pipeline.schedule, first.pipeline.stages)
        only = _median_cell([{**r, **_prediction(_predicted(c, summaries[c.report.out_dir], link, alone, share))}
                             for r, c in zip(runs_of_cell, cell, strict=True)])
        row["calibration_only"] = {k: only[k] for k in ("predicted_step_s", "predicted_bubble", "step_error",
                                                        "within", "books_within") if k in only}
    return row


