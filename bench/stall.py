"""Where the training step waits for the Loader, batch by batch, over whole epochs at a set share of its speed.

``bench e2e`` times passes of a few batches inside an endless stream; a training job runs epochs, and an epoch
has a start. Here a simulated accelerator (the one simulated device, ``SimAccelerator``: it sleeps ``batch / R``
seconds per batch, holding no core) trains whole epochs of the Loader at ``R`` = ``--load`` times the Loader's own
stand-alone rate, and every ``next()`` is timed. The Loader is built fresh for each run, warmed up over one epoch
taken at full speed, timed alone over a second one (its stand-alone rate, which sets ``R``), and then trained on for
``--epochs`` epochs, each a new ``iter()`` as a training loop makes it. Then two fresh Loaders each train one epoch
at the same ``R``, ``--build-s`` seconds after they were built (the job building its model): one as built (cold),
one with ``start()`` called at once (its first batches made during the build).

The time in ``next()`` (the stall) is split three ways, which add up to it:

- **epoch start**: the wait for each epoch's first batch (what the run started ahead for the next epoch, if it
  was started and had time, saved);
- **hand-off**: the waits of the other batches that were already made when asked for (queued: the time is the
  taking itself, and the interpreter's lock, the GIL, held by a Loader thread when the loop wants it back);
- **jitter**: the waits of batches not made yet when asked for (the Loader fell behind: the prefetch depth did not
  absorb a slow batch, or the machine's cores were taken).

What is neither the device's time nor the stall is the loop's own **overrun** (its sleep ending late, the GIL taken
back after it): of R + stall + overrun = 100%.

Each kind of epoch is summed up apart: the first after the pass at full speed (its run could start only as that
pass's reader finished, and a loop at full speed leaves it no time), the epochs after it (each started ahead while
the one before was trained on), a fresh Loader's first (cold or started). The goal (issue 36): under 2% stall and
at least 97% of ``R`` at 80% load, in one epoch as in many.

Then the loop (:mod:`stallfree.bench.stall_loop`): a training loop whose own Python work is a stated share of each
step (``--shares``, default 0%, 30% and 60%) beside the device's sleep, fed by the Loader, by the Loader with its graph
kept in the loop's process (``stallfree-here``), by torch's DataLoader with workers and by plain DALI, each at
``--load`` times the rate it sustains beside that loop: the stall, and how much
longer the loop's Python took than the same work with no feed running (its slowdown), measured in the same run.

Data: ``--synthetic N`` (default 2,000: 31 batches of 64) writes, into an empty DATA, the bench generator's
ImageNet-sized JPEGs (as ``bench e2e``: 375x500 +-25% a side, about 73 KiB, photographs' spectrum; not photos).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from stallfree.bench.loader import MEAN, STD, bench_files
from stallfree.bench.stall_loop import FEEDS, SHARES, print_loop, run_loop, steps_per_cell, summary
from stallfree.core.accelerator import SimAccelerator

__all__ = ["add_arguments", "parts", "run"]

EXAMPLES = """examples:
  stallfree bench stall ./bench-stall                  # 2,000 synthetic JPEGs there first, 4 epochs at 80% load
  stallfree bench stall ./bench-stall --epochs 1 --runs 5 --json | jq .summary
  stallfree bench stall ./bench-stall --shares 0.3 --feeds stallfree torch --json | jq .loop.summary
  stallfree bench stall ~/imagenet/val --load 0.9 --prefetch 4 --json-file stall.json
"""
GOAL = {"stall_share": 0.02, "of_r": 0.97}  # issue 36, item 1, at 80% load
KINDS = {"first": "first epoch after a pass at full speed", "rest": "the epochs after it",
         "cold": "a fresh Loader's first epoch", "started": "a fresh Loader's first epoch, start()ed"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("data", type=Path, help="an ImageFolder tree of JPEGs (written first when empty)")
    parser.add_argument("--synthetic", type=int, metavar="N", default=2000,
                        help="write N synthetic ImageNet-sized JPEGs into DATA first if it is empty (default 2000)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs trained at --load per run (default 4)")
    parser.add_argument("--runs", type=int, default=2, help="runs, each with a fresh Loader (default 2)")
    parser.add_argument("--load", type=float, default=0.8,
                        help="the accelerator's speed as a share of the Loader's stand-alone rate (default 0.8)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    parser.add_argument("--prefetch", type=int, default=None, help="the Loader's prefetch (default: its own)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="the Loader's threads (default: the cores this process may use)")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="the interpreter's switch interval for the run (sys.setswitchinterval; default: "
                        "Python's, 5 ms): how long the training loop may wait for the GIL held by a Loader thread")
    parser.add_argument("--build-s", type=float, default=1.0,
                        help="seconds between a fresh Loader's construction and its first batch: the job building "
                        "its model (default 1)")
    parser.add_argument("--shares", type=float, nargs="*", default=list(SHARES), metavar="SHARE",
                        help="then a loop whose own Python work is each SHARE of the step, beside each --feeds feed: "
                        "its stall and its Python's slowdown (default: 0 0.3 0.6; none given: no loop)")
    parser.add_argument("--feeds", nargs="+", choices=FEEDS, default=list(FEEDS),
                        help="the loop's feeds: stallfree (the Loader), torch (DataLoader with --threads workers), "
                        "dali (plain pipeline); default: all")
    parser.add_argument("--loop-epochs", type=int, default=3, help="epochs the loop trains at R per cell (default 3)")


def _check(args: argparse.Namespace) -> None:
    for flag in ("epochs", "runs", "batch_size", "threads", "loop_epochs"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if not 0 < args.load <= 1:
        raise ValueError(f"--load must be in (0, 1], a share of the Loader's stand-alone rate, got {args.load}")
    if args.prefetch is not None and args.prefetch < 1:
        raise ValueError(f"--prefetch must be positive, got {args.prefetch}")
    if args.switch_interval_ms is not None and not args.switch_interval_ms > 0:
        raise ValueError(f"--switch-interval-ms must be positive, got {args.switch_interval_ms}")
    bad = [share for share in args.shares if not 0 <= share < 1]
    if bad:
        raise ValueError(f"--shares must be in [0, 1), each a share of the step spent in the loop's Python, got {bad}")
    if args.build_s < 0:
        raise ValueError(f"--build-s must be >= 0, got {args.build_s}")


def _epoch(loader: Any, device: SimAccelerator | None, batch: int) -> dict[str, Any]:
    """One epoch from ``iter()`` on: every ``next()``'s wait, the last (which ends the epoch) included.

    And whether each batch was already made (on the run's output queue) when asked for.
    """
    waits: list[float] = []
    ready: list[bool] = []
    start = time.perf_counter()
    it = iter(loader)
    images = 0
    while True:
        ready.append(it.run.ready())
        asked = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            waits.append(time.perf_counter() - asked)
            break
        waits.append(time.perf_counter() - asked)
        images += batch
        if device is not None:
            device.step(batch)
    wall = time.perf_counter() - start
    return {"wall_s": wall, "images": images, "img_per_s": images / wall, "waits_s": waits, "ready": ready}


def parts(waits: list[float], ready: list[bool], wall: float) -> dict[str, float]:
    """The stall of one epoch's ``waits`` (seconds, in order) over ``wall``, split into start, hand-off and jitter.

    The three add up to the stall: the first batch's wait, the other waits of batches ``ready`` when asked for,
    and the waits of those that were not.
    """
    rest = list(zip(waits[1:], ready[1:], strict=True))
    handed = [w for w, r in rest if r]
    late = [w for w, r in rest if not r]
    return {"stall": sum(waits) / wall, "start": waits[0] / wall if waits else 0.0,
            "handoff": sum(handed) / wall, "jitter": sum(late) / wall,
            "first_ms": waits[0] * 1e3 if waits else 0.0,
            "handoff_median_ms": statistics.median(handed) * 1e3 if handed else 0.0,
            "handoff_max_ms": max(handed) * 1e3 if handed else 0.0,
            "late": len(late), "late_max_ms": max(late) * 1e3 if late else 0.0}


def _loader(args: argparse.Namespace) -> Any:
    from stallfree.pipeline.loader import Loader
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    extra = {} if args.prefetch is None else {"prefetch": args.prefetch}
    return Loader(args.data, args.batch_size, transform=[RandomResizedCrop(224), RandomHorizontalFlip(),
                  Normalize(MEAN, STD)], shuffle=True, num_threads=args.threads, drop_last=True, **extra)


def _timed(loader: Any, device: SimAccelerator, args: argparse.Namespace) -> dict[str, Any]:
    one = _epoch(loader, device, args.batch_size)
    one.update(parts(one["waits_s"], one["ready"], one["wall_s"]), of_r=one["img_per_s"] / device.images_per_s)
    one["overrun"] = 1.0 - one["of_r"] - one["stall"]
    return one


def _one_run(args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    """One Loader's warm-up, stand-alone epoch and epochs at R; then a fresh Loader's first epoch, cold and started."""
    with _loader(args) as loader:
        _epoch(loader, None, args.batch_size)  # warm-up: the kernels, the page cache
        bar.update()
        alone = _epoch(loader, None, args.batch_size)
        bar.update()
        device = SimAccelerator(args.load * alone["img_per_s"])
        epochs = []
        for _ in range(args.epochs):
            epochs.append(_timed(loader, device, args))
            bar.update()
    fresh = {}
    for kind in ("cold", "started"):
        with _loader(args) as loader:
            if kind == "started":
                loader.start()
            time.sleep(args.build_s)  # the job builds its model
            fresh[kind] = _timed(loader, device, args)
            bar.update()
    return {"standalone": alone["img_per_s"], "speed": device.images_per_s, "epochs": epochs, "fresh": fresh}


def _summary(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Medians over the runs' epochs of one kind (see :data:`KINDS`)."""
    chosen = {"first": [r["epochs"][0] for r in runs], "rest": [e for r in runs for e in r["epochs"][1:]],
              "cold": [r["fresh"]["cold"] for r in runs], "started": [r["fresh"]["started"] for r in runs]}[key]
    if not chosen:
        return {}
    return {name: statistics.median(e[name] for e in chosen)
            for name in ("of_r", "stall", "start", "handoff", "jitter", "overrun", "first_ms", "handoff_median_ms",
                         "handoff_max_ms", "late", "late_max_ms")}


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return the results (JSON-able)."""
    from tqdm import tqdm

    _check(args)
    files = bench_files(args.data, args.synthetic, args.batch_size)
    interval = sys.getswitchinterval()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
    try:
        with tqdm(total=args.runs * (args.epochs + 4), desc="epochs", unit="epoch", file=sys.stderr,
                  disable=not getattr(args, "progress", True)) as bar:
            runs = [_one_run(args, bar) for _ in range(args.runs)]
        per_epoch = len(files) // args.batch_size
        steps = args.runs * len(args.feeds) * sum(steps_per_cell(args, per_epoch, s) for s in args.shares)
        with tqdm(total=steps, desc="loop", unit="batch", file=sys.stderr, mininterval=1.0,
                  disable=not getattr(args, "progress", True)) as bar:
            cells = run_loop(args, per_epoch, lambda: _loader(args), bar)
    finally:
        sys.setswitchinterval(interval)
    for r in runs:
        for e in [*r["epochs"], *r["fresh"].values()]:
            e["waits_ms"] = [round(w * 1e3, 3) for w in e.pop("waits_s")]
    result = {"images": len(files), "batch_size": args.batch_size, "batches": len(files) // args.batch_size,
              "threads": args.threads, "load": args.load, "prefetch": args.prefetch,
              "switch_interval_ms": (args.switch_interval_ms or interval * 1e3), "load_average": os.getloadavg(),
              "build_s": args.build_s, "runs": runs, "summary": {key: _summary(runs, key) for key in KINDS},
              "loop": {"shares": args.shares, "epochs": args.loop_epochs, "cells": cells, "summary": summary(cells)}}
    _print(result, out)
    if cells:
        print_loop(result["loop"]["summary"], args.load, out)
    return result


def _print(result: dict[str, Any], out: TextIO) -> None:
    load = result["load"]
    print(f"{result['images']} JPEGs, batch {result['batch_size']} ({result['batches']} a epoch), "
          f"{result['threads']} threads; an accelerator at {load:.0%} of the Loader's stand-alone rate; "
          f"load average {result['load_average'][0]:.2f} at the end", file=out)
    print("| run | epoch | alone img/s | R img/s | of R | stall | start | hand-off | jitter | overrun | first ms | "
          "hand-off median / max ms | late batches (max ms) |", file=out)
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", file=out)
    for i, r in enumerate(result["runs"]):
        rows = [(str(j), e) for j, e in enumerate(r["epochs"])] + [(f"fresh, {k}", e) for k, e in r["fresh"].items()]
        for name, e in rows:
            print(f"| {i} | {name} | {r['standalone']:.0f} | {r['speed']:.0f} | {e['of_r']:.1%} | {e['stall']:.2%} | "
                  f"{e['start']:.2%} | {e['handoff']:.2%} | {e['jitter']:.2%} | {e['overrun']:.2%} | "
                  f"{e['first_ms']:.1f} | {e['handoff_median_ms']:.2f} / {e['handoff_max_ms']:.1f} | "
                  f"{e['late']} ({e['late_max_ms']:.1f}) |", file=out)
    for key, label in KINDS.items():
        s = result["summary"][key]
        if not s:
            continue
        met = s["stall"] < GOAL["stall_share"] and s["of_r"] >= GOAL["of_r"]
        print(f"{label} (median): {s['of_r']:.1%} of R, stall {s['stall']:.2%} (start {s['start']:.2%}, hand-off "
              f"{s['handoff']:.2%}, jitter {s['jitter']:.2%}), overrun {s['overrun']:.2%}; goal < 2% and >= 97% of R: "
              f"{'met' if met else 'not met'}", file=out)
