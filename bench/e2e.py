"""Delivered images/s when a simulated accelerator consumes the batches: each feed against a sweep of device speeds.

A feed's stand-alone rate says how fast it can go; a training job only sees what it delivers while the device
works. Here the consumer is an accelerator of speed ``R`` img/s that holds no host CPU (the one simulated device,
:class:`stallfree.core.accelerator.SimAccelerator`): for every batch it sleeps ``batch_size / R`` seconds
(``time.sleep`` releases the GIL and the core), then asks for the next one. The time
spent inside ``next()`` is the input stall. A feed should deliver min(R, its stand-alone rate) minus overheads.

The feeds, all over the same data in one process and one run, with ``bench loader``'s contenders
(:func:`stallfree.bench.loader.contender_stream`) and its augmentation (RandomResizedCrop(224), flip, normalize,
batch 64): torch's DataLoader (the one baseline, PIL decode, torchvision's transforms when importable, workers =
cores), a plain DALI pipeline, stallfree's Loader over the folder, over Arrow shards, over shards ingested with
``--max-side 256``, and over the folder with ``echo=2`` (each decoded sample augmented twice).

Each feed is built once and kept alive for its whole sweep: a warm-up, then its stand-alone rate (no sleep), then
each speed from the fastest down (a slower consumer leaves the prefetch queues at least as full as a faster one,
so no speed starts with batches saved up by a slower one), each after a few untimed settling batches at that speed.
Every cell is ``--repeats`` passes of ``--batches`` batches: the median delivered img/s with its min-max spread,
the median stall share (time in ``next()`` over wall time) and the host CPU use (CPU seconds of this process and
its live children, the DataLoader's workers, over wall seconds; psutil). Feeds run one after another, never in
turns, as in ``bench loader``.

The speed at 80% of stallfree's (folder) stand-alone rate is added to the sweep, for issue 11's target: there
stallfree should deliver >= 95% of R with a stall under 2%, and >= 1.8x torch's DataLoader.

Data: ``--synthetic N`` (default 1,000) writes, into an empty DATA, the bench data generator's ImageNet-sized
JPEGs (:func:`stallfree.ingest.synthetic.make_image_folder` with ``style="natural"``, 375x500 +-25% per side,
quality 90: about 0.19 MP and 73 KiB each). Their textures have photographs' power-law spectrum and colour
correlations, so they cost what a photo costs to decode; they are not photos.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from stallfree.bench.loader import bench_files, contender_stream, shard_runs
from stallfree.core.accelerator import SimAccelerator
from stallfree.core.cpu import cpu_seconds

__all__ = ["add_arguments", "draw", "run"]

EXAMPLES = """examples:
  stallfree bench e2e ./bench-data                     # 1,000 synthetic JPEGs there first, all feeds, e2e.png
  stallfree bench e2e ./bench-data --speeds 300 600 --feeds stallfree torch --json | jq .target
  stallfree bench e2e ~/imagenet/train --batches 30 --json-file e2e.json   # e2e.png beside it
"""

# name: (label, bench loader contender, data, echo); "stallfree" first: its stand-alone rate sets the target speed
FEEDS = {
    "stallfree": ("stallfree, folder", "stallfree", "folder", 1),
    "torch": ("torch DataLoader", "torch", "folder", 1),
    "dali": ("plain DALI", "dali", "folder", 1),
    "shards": ("stallfree, shards", "stallfree", "stallfree, shards", 1),
    "small": ("stallfree, shards --max-side 256", "stallfree", "stallfree, shards --max-side 256", 1),
    "echo": ("stallfree, folder, echo=2", "stallfree", "folder", 2),
}
SPEEDS = (250.0, 500.0, 1000.0, 2000.0, 4000.0)
SETTLE = 3  # untimed batches at each new speed before its passes
TARGET = {"fraction": 0.95, "stall_share": 0.02, "vs_torch": 1.8}  # issue 11, section 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("data", type=Path, help="an ImageFolder tree of JPEGs (written first when empty)")
    parser.add_argument("--synthetic", type=int, metavar="N", default=1000,
                        help="write N synthetic ImageNet-sized JPEGs into DATA first if it is empty (default 1000)")
    parser.add_argument("--speeds", type=float, nargs="+", default=list(SPEEDS), metavar="IMG_PER_S",
                        help="accelerator speeds to sweep (default: %(default)s; 80%% of stallfree's stand-alone "
                        "rate is added)")
    parser.add_argument("--feeds", nargs="+", choices=FEEDS, default=list(FEEDS),
                        help="stallfree (folder), torch (DataLoader), dali (plain pipeline), shards, small "
                        "(shards --max-side 256), echo (echo=2); default: all")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch")
    parser.add_argument("--batches", type=int, default=15, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per cell (the median is shown)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed batches after each feed is built")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads or workers for every feed (default: the cores this process may use)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda[:N] (as bench loader's --device)")
    parser.add_argument("--png", type=Path, metavar="PATH",
                        help="the chart (default: e2e.png beside --json-file, else in the current folder)")
    # The demo shows the sweep without the project's own throughput goals, which are this benchmark's business.
    parser.add_argument("--no-goals", dest="goals", action="store_false", help=argparse.SUPPRESS)


def _check(args: argparse.Namespace) -> None:
    bad = [s for s in args.speeds if not s > 0]
    if bad:
        raise ValueError(f"--speeds must be positive images/s (an accelerator's speed), got {bad}")
    for flag in ("batch_size", "batches", "repeats"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.warmup < 0 or args.threads < 1:
        raise ValueError(f"--warmup must be >= 0 and --threads >= 1, got {args.warmup} and {args.threads}")


def _pass(stream: Iterator[Any], args: argparse.Namespace, speed: float | None, process: Any, bar: Any,
          batches: int | None = None) -> dict[str, float]:
    """``batches`` batches to an accelerator of ``speed`` img/s (None: no accelerator, the stand-alone rate)."""
    batches = args.batches if batches is None else batches
    device = None if speed is None else SimAccelerator(speed)
    waited = 0.0
    cpu = cpu_seconds(process.pid)
    start = time.perf_counter()
    for _ in range(batches):
        asked = time.perf_counter()
        next(stream)
        waited += time.perf_counter() - asked
        if device is not None:
            device.step(args.batch_size)  # the device's step: no CPU, no GIL
        bar.update()
    wall = time.perf_counter() - start
    return {"img_per_s": batches * args.batch_size / wall, "stall_share": min(1.0, waited / wall),
            "cpu_cores": (cpu_seconds(process.pid) - cpu) / wall}


def _cell(speed: float | None, passes: list[dict[str, float]]) -> dict[str, Any]:
    rates = [p["img_per_s"] for p in passes]
    return {"speed": speed, "delivered": statistics.median(rates), "runs": rates, "spread": [min(rates), max(rates)],
            "stall_share": statistics.median(p["stall_share"] for p in passes),
            "cpu_cores": statistics.median(p["cpu_cores"] for p in passes)}


def _sweep(label: str, contender: str, args: argparse.Namespace, speeds: list[float], target: bool) -> dict[str, Any]:
    """Build one feed, warm it up, time it alone, then at each speed (fastest first); shut it down."""
    import psutil
    from tqdm import tqdm

    process = psutil.Process()
    per_speed = SETTLE + args.repeats * args.batches
    total = args.warmup + args.repeats * args.batches + per_speed * (len(speeds) + target)
    with (contender_stream(contender, args) as stream,
          tqdm(total=total, desc=label, unit="batch", file=sys.stderr, mininterval=1.0, leave=False,
               disable=not getattr(args, "progress", True)) as bar):
        for _ in range(args.warmup):
            next(stream)
            bar.update()
        alone = _cell(None, [_pass(stream, args, None, process, bar) for _ in range(args.repeats)])
        if target:
            speeds = _with_target(speeds, alone["delivered"])
        cells = []
        for speed in sorted(speeds, reverse=True):
            _pass(stream, args, speed, process, bar, batches=SETTLE)
            cells.append(_cell(speed, [_pass(stream, args, speed, process, bar) for _ in range(args.repeats)]))
    return {"standalone": alone, "cells": sorted(cells, key=lambda c: c["speed"])}


def _with_target(speeds: list[float], standalone: float) -> list[float]:
    return sorted(set(speeds) | {float(round(0.8 * standalone))})


def _data_facts(files: list[tuple[str, int]]) -> dict[str, float]:
    from PIL import Image

    sizes, pixels = [], []
    for path, _ in files[:500]:  # headers only; 500 are enough for a mean
        with Image.open(path) as image:
            pixels.append(image.width * image.height)
        sizes.append(os.path.getsize(path))
    return {"mean_kib": statistics.fmean(sizes) / 1024, "mean_mp": statistics.fmean(pixels) / 1e6}


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out``, draw the PNG and return the results (JSON-able)."""
    _check(args)
    files = bench_files(args.data, args.synthetic, args.batch_size)
    chosen = [name for name in FEEDS if name in args.feeds]
    speeds = sorted(set(args.speeds))
    feeds: dict[str, Any] = {}
    target_speed = None
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-e2e-") as work:
        places = {"folder": args.data}
        if {"shards", "small"} & set(chosen):
            places.update({label: data for label, _, data in shard_runs(args, Path(work))})
        for name in chosen:
            label, contender, place, echo = FEEDS[name]
            feed_args = argparse.Namespace(**{**vars(args), "data": places[place], "echo": echo})
            feeds[label] = _sweep(label, contender, feed_args, speeds, target=name == "stallfree")
            if name == "stallfree":
                target_speed = float(round(0.8 * feeds[label]["standalone"]["delivered"]))
                speeds = _with_target(speeds, feeds[label]["standalone"]["delivered"])
    from stallfree.stage_runtime.baseline import transform_label

    result = {"images": len(files), **_data_facts(files), "batch_size": args.batch_size, "batches": args.batches,
              "repeats": args.repeats, "threads": args.threads, "device": args.device,
              "cores": len(os.sched_getaffinity(0)), "speeds": speeds, "target_speed": target_speed,
              "feeds": feeds, "target": _target(feeds, target_speed), "torch_transform": transform_label()}
    _print(result, out, goals=args.goals)
    png = args.png or (args.json_file.parent if getattr(args, "json_file", None) else Path()) / "e2e.png"
    result["png"] = str(draw(result, png))
    print(f"chart: {png}", file=out)
    return result


def _target(feeds: dict[str, Any], speed: float | None) -> dict[str, Any] | None:
    """Issue 11's check at R = 80% of stallfree's stand-alone rate, or None without the stallfree (folder) feed."""
    if speed is None:
        return None

    def at(label: str) -> dict[str, Any] | None:
        cells = feeds.get(label, {}).get("cells", [])
        return next((c for c in cells if c["speed"] == speed), None)

    mine, torch = at(FEEDS["stallfree"][0]), at(FEEDS["torch"][0])
    assert mine is not None  # the stallfree feed's sweep always holds its own target speed
    check: dict[str, Any] = {"speed": speed, "stallfree": mine["delivered"], "fraction": mine["delivered"] / speed,
                             "stall_share": mine["stall_share"], "torch": None, "vs_torch": None, "goals": TARGET}
    if torch is not None:
        check.update(torch=torch["delivered"], vs_torch=mine["delivered"] / torch["delivered"])
    check["met"] = (check["fraction"] >= TARGET["fraction"] and check["stall_share"] < TARGET["stall_share"]
                    and (check["vs_torch"] is None or check["vs_torch"] >= TARGET["vs_torch"]))
    return check


def _print(result: dict[str, Any], out: TextIO, goals: bool = True) -> None:
    speeds, target = result["speeds"], result["target_speed"]
    print(f"{result['images']} JPEGs ({result['mean_mp']:.2f} MP, {result['mean_kib']:.0f} KiB mean), batch "
          f"{result['batch_size']}, {result['threads']} threads on {result['cores']} cores, {result['device']}; "
          f"median of {result['repeats']} x {result['batches']} batches per cell", file=out)
    heads = ["alone"] + [f"R={s:.0f}" + ("*" if s == target else "") for s in speeds]
    print("delivered img/s (input stall %) against accelerator speed R img/s"
          + ("; * = 80% of stallfree's stand-alone rate" if target else ""), file=out)
    print(f"| {'feed':<33} | " + " | ".join(f"{h:>11}" for h in heads) + " |", file=out)
    print(f"|{'-' * 35}|" + "|".join(f"{'-' * 12}:" for _ in heads) + "|", file=out)
    for label, feed in result["feeds"].items():
        by_speed = {c["speed"]: c for c in feed["cells"]}
        cells = [f"{feed['standalone']['delivered']:.0f}"]
        cells += [f"{by_speed[s]['delivered']:.0f} ({100 * by_speed[s]['stall_share']:.0f}%)" if s in by_speed
                  else "-" for s in speeds]
        print(f"| {label:<33} | " + " | ".join(f"{c:>11}" for c in cells) + " |", file=out)
    print("\nevery cell: median, min-max of the passes, share of R, input stall, host CPU (cores)", file=out)
    print(f"| {'feed':<33} | {'R img/s':>7} | {'delivered':>9} | {'spread':>11} | {'of R':>5} | {'stall':>5} "
          f"| {'CPU':>4} |", file=out)
    print(f"|{'-' * 35}|{'-' * 8}:|{'-' * 10}:|{'-' * 12}:|{'-' * 6}:|{'-' * 6}:|{'-' * 5}:|", file=out)
    for label, feed in result["feeds"].items():
        for c in [feed["standalone"], *feed["cells"]]:
            r = "alone" if c["speed"] is None else f"{c['speed']:.0f}"
            share = "-" if c["speed"] is None else f"{100 * c['delivered'] / c['speed']:.0f}%"
            spread = f"{c['spread'][0]:.0f}-{c['spread'][1]:.0f}"
            print(f"| {label:<33} | {r:>7} | {c['delivered']:>9.0f} | {spread:>11} | {share:>5} "
                  f"| {100 * c['stall_share']:>4.0f}% | {c['cpu_cores']:>4.2f} |", file=out)
    check = result["target"]
    if check is not None and goals:
        vs = ("torch DataLoader not run" if check["vs_torch"] is None else
              f"{check['vs_torch']:.2f}x torch DataLoader's {check['torch']:.0f} (goal >= {TARGET['vs_torch']}x)")
        print(f"\ntarget (issue 11) at R = {check['speed']:.0f} img/s (80% of stallfree's stand-alone rate): "
              f"stallfree delivers {check['stallfree']:.0f} = {100 * check['fraction']:.1f}% of R (goal >= "
              f"{100 * TARGET['fraction']:.0f}%), input stall {100 * check['stall_share']:.1f}% (goal < "
              f"{100 * TARGET['stall_share']:.0f}%), {vs}: {'met' if check['met'] else 'NOT met'}", file=out)
    if "torch DataLoader" in result["feeds"]:
        print(f"torch DataLoader: PIL decode, {result['torch_transform']}", file=out)


def draw(result: dict[str, Any], path: str | Path) -> Path:
    """Delivered img/s against accelerator speed, one line per feed, the ideal y = x, stand-alone rates dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6.5))
    speeds = result["speeds"]
    ax.plot(speeds, speeds, color="black", linestyle=":", label="ideal: delivered = accelerator speed")
    for i, (label, feed) in enumerate(result["feeds"].items()):
        colour = f"C{i % 10}"
        x = [c["speed"] for c in feed["cells"]]
        y = [c["delivered"] for c in feed["cells"]]
        low = [c["delivered"] - c["spread"][0] for c in feed["cells"]]
        high = [c["spread"][1] - c["delivered"] for c in feed["cells"]]
        ax.errorbar(x, y, yerr=[low, high], color=colour, marker="o", markersize=4, capsize=3, label=label)
        alone = feed["standalone"]["delivered"]
        ax.axhline(alone, color=colour, linestyle="--", linewidth=1, alpha=0.6)
    ax.plot([], [], color="grey", linestyle="--", linewidth=1, label="each feed's stand-alone rate (dashed)")
    if result["target_speed"]:
        ax.axvline(result["target_speed"], color="grey", linestyle="-.", linewidth=1,
                   label=f"80% of stallfree's stand-alone rate ({result['target_speed']:.0f} img/s)")
    ax.set_xscale("log")
    ax.set_yscale("log")  # the sweep spans 16x; straight lines stay straight
    ax.set_xlabel("simulated accelerator speed R (img/s; the consumer sleeps batch / R per batch)")
    ax.set_ylabel("delivered images / s (median; bars: min-max)")
    ax.set_title(f"{result['images']} JPEGs ({result['mean_mp']:.2f} MP), batch {result['batch_size']}, "
                 f"{result['threads']} threads on {result['cores']} cores, {result['device']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
