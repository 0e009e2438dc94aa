"""The planner's predictions against the trainer's measurements: step time and bubble for every synchronous schedule.

For each bundled model (``--models``), pipeline ranks (``--stages``) and micro-batch count (``--microbatches``),
every synchronous schedule torch accepts is trained for ``--steps`` steps on generated tensors (no input cost) in
one set of stage processes per rank count, on gloo, and its measured step time and bubble (medians over the steps
after the first) are set beside the simulator's prediction for the same split (``stallfree.stage_runtime.plan
.predict``). The link is calibrated first from measured sends between two processes
(``stage_runtime/plan/calibrate.py``), unless ``--link`` gives one. The table says, per cell, whether the step is
within 15% and the bubble within 5 points, and the count of cells that are.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

__all__ = ["EXAMPLES", "add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench plan                                     # mlp and small_cnn, S 2 and 4, M 2, 4, 8
  stallfree bench plan --models mlp --stages 2 --microbatches 4 --steps 6
  stallfree bench plan --link 1GB/s,2ms --json-file bench-plan.json   # a given link instead of the calibration
"""
STEP_TOLERANCE, BUBBLE_POINTS = 0.15, 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    from stallfree.stage_runtime.train.schedules import SCHEDULES  # all synchronous; no torch import for --help

    parser.add_argument("--models", nargs="+", choices=("mlp", "small_cnn"), default=["mlp", "small_cnn"],
                        help="bundled models to plan and train")
    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES),
                        help="synchronous schedules")
    parser.add_argument("--stages", nargs="+", type=int, default=[2, 4], help="pipeline ranks to try")
    parser.add_argument("--microbatches", nargs="+", type=int, default=[2, 4, 8], help="micro-batch counts")
    parser.add_argument("--steps", type=int, default=8, help="steps per job (the first is not counted)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per step")
    parser.add_argument("--image-size", type=int, default=16, help="side of the generated images")
    parser.add_argument("--link", help="BANDWIDTH,LATENCY instead of the calibration, e.g. 1GB/s,2ms")


def _jobs(args: argparse.Namespace, stages: int, out: Path) -> tuple[list[Any], list[str]]:
    from stallfree.stage_runtime.train.config import TrainConfig
    from stallfree.stage_runtime.train.schedules import schedule_spec

    configs, skipped = [], []
    for model in args.models:
        for schedule in args.schedules:
            for m in args.microbatches:
                spec = schedule_spec(schedule)
                try:
                    if args.batch_size % m:
                        raise ValueError(f"{m} does not divide --batch-size {args.batch_size}")
                    spec.check(stages, m)
                except ValueError as err:
                    skipped.append(f"{model} {schedule} S={stages} M={m}: {err}")
                    continue
                configs.append(TrainConfig(
                    model=model, image_size=args.image_size, samples=args.batch_size * (args.steps + 1),
                    stages=stages, schedule=schedule, microbatches=m, batch_size=args.batch_size,
                    max_steps=args.steps, progress=False, out_dir=str(out / f"{model}-{schedule}-s{stages}-m{m}")))
    return configs, skipped


def _measured(config: Any) -> tuple[float, float]:
    """Median step seconds and bubble over the steps after the first, from the job's train.jsonl."""
    rows = [json.loads(line) for line in (Path(config.out_dir) / "train.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r][1:] or [r for r in rows if "loss" in r]
    return statistics.median(r["step_s"] for r in steps), statistics.median(r["bubble"] for r in steps)


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    from stallfree.stage_runtime.plan.calibrate import calibrate_gloo_link
    from stallfree.stage_runtime.plan.costs import parse_link
    from stallfree.stage_runtime.plan.predict import predict_training
    from stallfree.stage_runtime.train.trainer import train_many

    if args.steps < 2 or args.batch_size < 1 or min(args.stages) < 2:
        raise ValueError("--steps must be >= 2, --batch-size >= 1 and every --stages >= 2")
    if args.link:
        link, how = parse_link(args.link), "given"
    else:
        print("calibrating the link: gloo sends between two processes ...", file=sys.stderr, flush=True)
        link, how = calibrate_gloo_link(), "calibrated from measured sends"
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-plan-") as tmp:
        for stages in args.stages:
            configs, left_out = _jobs(args, stages, Path(tmp))
            skipped += left_out
            if not configs:
                continue
            print(f"training {len(configs)} jobs in {stages} stage processes ...", file=sys.stderr, flush=True)
            for config, summary in zip(configs, train_many(configs), strict=True):
                step_s, bubble = _measured(config)
                predicted = predict_training(config, tuple(summary["balance"]), summary["num_classes"], link)
                rows.append({"model": config.model, "schedule": config.schedule, "stages": stages,
                             "microbatches": config.microbatches, "balance": summary["balance"],
                             "measured_step_s": step_s, "predicted_step_s": predicted["step_s"],
                             "measured_bubble": bubble, "predicted_bubble": predicted["bubble"],
                             "step_error": predicted["step_s"] / step_s - 1,
                             "within": abs(predicted["step_s"] / step_s - 1) <= STEP_TOLERANCE
                             and abs(predicted["bubble"] - bubble) <= BUBBLE_POINTS})
    hits = sum(r["within"] for r in rows)
    print(f"link {link.describe()} ({how}); batch {args.batch_size}, {args.steps} steps per job, medians after "
          "the first", file=out)
    print(f"| {'model':<9} | {'schedule':<16} | {'S':>1} | {'M':>2} | {'step ms meas.':>13} | {'pred.':>8} | "
          f"{'error':>6} | {'bubble meas.':>12} | {'pred.':>6} | ok |", file=out)
    print(f"|{'-' * 11}|{'-' * 18}|{'-' * 3}|{'-' * 4}|{'-' * 15}|{'-' * 10}|{'-' * 8}|{'-' * 14}|{'-' * 8}|----|",
          file=out)
    for r in rows:
        print(f"| {r['model']:<9} | {r['schedule']:<16} | {r['stages']:>1} | {r['microbatches']:>2} | "
              f"{r['measured_step_s'] * 1e3:>13.1f} | {r['predicted_step_s'] * 1e3:>8.1f} | "
              f"{r['step_error']:>+6.0%} | {r['measured_bubble']:>12.1%} | {r['predicted_bubble']:>6.1%} | "
              f"{'yes' if r['within'] else 'no':<2} |", file=out)
    print(f"{hits} of {len(rows)} cells within {STEP_TOLERANCE:.0%} step time and {BUBBLE_POINTS * 100:.0f} bubble "
          "points", file=out)
    for reason in skipped:
        print(f"skipped {reason}", file=out)
    return {"link": link.describe(), "link_source": how, "rows": rows, "within": hits, "cells": len(rows),
            "skipped": skipped}
