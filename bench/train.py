"""Pipeline throughput and measured bubble per schedule and micro-batch count, beside theory; Loader vs DataLoader.

Part 1 trains a generated-data model (no input cost) for ``--steps`` steps under every schedule at each
``--microbatches`` count, all in one set of stage processes, and reports images/s with the measured bubble
(idle share of the ranks inside the schedule's step) beside the schedule's theory. Part 2 trains the same small
CNN in 2 stages with 1F1B fed by stallfree's Loader and then by torch's DataLoader (PIL decode, the same number
of threads as workers) on one synthetic ImageFolder, and reports images/s and the input-stall share of each.
The first step of every job, which includes warm-up, is counted: use enough ``--steps`` to drown it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any, TextIO

__all__ = ["EXAMPLES", "add_arguments", "run", "schedule_jobs"]

EXAMPLES = """examples:
  stallfree bench train                                   # every schedule at 2, 4, 8 micro-batches, then the feeds
  stallfree bench train --microbatches 4 8 16 --steps 30 --json-file bench-train.json
  stallfree bench train --only feeds --images 2000
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    from stallfree.stage_runtime.schedules import SCHEDULES

    parser.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES), help="schedules to run")
    parser.add_argument("--microbatches", nargs="+", type=int, default=[2, 4, 8], help="micro-batch counts to try")
    parser.add_argument("--steps", type=int, default=20, help="steps per job")
    parser.add_argument("--stages", type=int, default=2, help="pipeline ranks")
    parser.add_argument("--batch-size", type=int, default=64, help="images per step")
    parser.add_argument("--images", type=int, default=1200, help="synthetic JPEGs for the feed comparison")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="Loader threads = DataLoader workers")
    parser.add_argument("--only", choices=("schedules", "feeds"), help="run one part")


def schedule_jobs(args: argparse.Namespace, out: Path) -> tuple[list[Any], list[str]]:
    """The sweep's training jobs, and why each (schedule, micro-batches) pair left out cannot run."""
    from stallfree.stage_runtime.config.train_config import TrainConfig
    from stallfree.stage_runtime.schedules import schedule_spec

    configs, skipped = [], []
    for schedule in args.schedules:
        for m in args.microbatches:
            try:
                schedule_spec(schedule).check(args.stages, m)
            except ValueError as err:
                skipped.append(f"{schedule} M={m}: {err}")
                continue
            configs.append(TrainConfig.from_flags(
                model="mlp", model_kwargs={"hidden": 512, "depth": 8}, image_size=16, samples=args.batch_size * 200,
                stages=args.stages, schedule=schedule, microbatches=m, batch_size=args.batch_size,
                max_steps=args.steps, progress=False, out_dir=str(out / f"{schedule}-m{m}")))
    return configs, skipped


def _schedules(configs: list[Any]) -> list[dict[str, Any]]:
    from stallfree.stage_runtime.jobs import train_many

    rows = []
    for config, s in zip(configs, train_many(configs), strict=True):
        rows.append({"schedule": config.pipeline.schedule, "microbatches": config.pipeline.microbatches,
                     "images_per_s": s["images_per_s"], "bubble": s["bubble_fraction"],
                     "bubble_theory": s["bubble_theory"]})
    return rows


def _feeds(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    from stallfree.ingest.synthetic import make_image_folder
    from stallfree.stage_runtime.config.train_config import TrainConfig
    from stallfree.stage_runtime.jobs import train_many

    data = make_image_folder(out / "data", num_classes=4, per_class=max(1, args.images // 4), size=(64, 64))
    configs = [TrainConfig.from_flags(model="small_cnn", data=str(data), image_size=32, batch_size=args.batch_size,
                                      microbatches=4, schedule="1f1b", stages=2, max_steps=args.steps, feed=feed,
                                      loader_threads=args.workers, progress=False, out_dir=str(out / f"feed-{feed}"))
               for feed in ("stallfree", "torch")]
    rows = []
    for config, s in zip(configs, train_many(configs), strict=True):
        rows.append({"feed": "stallfree Loader" if config.feed.kind == "stallfree" else "torch DataLoader",
                     "images_per_s": s["images_per_s"], "input_stall": s["input_stall_fraction"],
                     "bubble": s["bubble_fraction"]})
    return rows


def _theory(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "n/a"


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its tables to ``out`` and return its results (JSON-able)."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-train-") as tmp:
        if args.only in (None, "schedules"):
            configs, result["skipped"] = schedule_jobs(args, Path(tmp))
            result["schedules"] = _schedules(configs)
            print(f"\nschedules, {args.stages} pipeline ranks, batch {args.batch_size}, {args.steps} steps", file=out)
            print(f"| {'schedule':<17} | {'M':>3} | {'images/s':>9} | {'bubble':>7} | {'theory':>7} |", file=out)
            print(f"|{'-' * 19}|{'-' * 5}|{'-' * 11}|{'-' * 9}|{'-' * 9}|", file=out)
            for r in result["schedules"]:
                print(f"| {r['schedule']:<17} | {r['microbatches']:>3} | {r['images_per_s']:>9.1f} | "
                      f"{r['bubble']:>7.1%} | {_theory(r['bubble_theory']):>7} |", file=out)
            for reason in result["skipped"]:
                print(f"skipped {reason}", file=out)
        if args.only in (None, "feeds"):
            result["feeds"] = _feeds(args, Path(tmp))
            print(f"\nfeeds, small_cnn 2 stages 1F1B, batch {args.batch_size}, {args.workers} threads/workers",
                  file=out)
            print(f"| {'feed':<17} | {'images/s':>9} | {'input stall':>11} | {'bubble':>7} |", file=out)
            print(f"|{'-' * 19}|{'-' * 11}|{'-' * 13}|{'-' * 9}|", file=out)
            for r in result["feeds"]:
                print(f"| {r['feed']:<17} | {r['images_per_s']:>9.1f} | {r['input_stall']:>11.1%} | "
                      f"{r['bubble']:>7.1%} |", file=out)
    return result
