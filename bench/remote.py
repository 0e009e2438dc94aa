"""The Loader over the same shards on local disk, over HTTP and over S3, through a proxy adding latency.

One synthetic dataset is ingested once; the Loader then reads it from local disk, and from an HTTP server (with
Range) and moto's S3 server on 127.0.0.1 through the fault proxy at each ``--latency`` (ms added to every reply)
under a ``--bandwidth`` cap, each from a cold cache; last, with a cache of ``--cache-share`` of the dataset and
``shuffle="block"``, which is compared with the same block shuffle on local disk (the other rows with the global
shuffle on local disk). A simulated training step (``--step-ms``, default half the local Loader's time per batch)
follows every batch, so the input-stall share means what it does in training: the share of the loop's time spent
waiting in ``next(loader)``. Images/s and the stall share count from the 11th batch on, once the first shards
have arrived and the prefetch queues have filled; the time to first batch is measured from the Loader's
construction. Every row runs ``--repeats`` times, the rows taking turns (so a busy minute of a shared machine
falls on all of them), and the table gives medians. The servers run in a process of their own, so they take no
interpreter time from the Loader.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from stallfree.core.accelerator import SimAccelerator
from stallfree.core.cpu import cpu_seconds

__all__ = ["add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench remote                                   # 1,200 synthetic images, 0/20/100 ms, 100 MB/s
  stallfree bench remote --images 4000 --latency 0 50 --bandwidth 25 --json | jq .rows
  stallfree bench remote --repeats 5 --json-file bench-remote.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--images", type=int, default=1200, help="synthetic JPEGs in the dataset")
    parser.add_argument("--size", type=int, nargs=2, default=(240, 320), metavar=("H", "W"), help="their size")
    parser.add_argument("--shard-mb", type=float, default=0.5, help="shard size of the ingest")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch")
    parser.add_argument("--latency", type=float, nargs="+", default=(0.0, 20.0, 100.0), metavar="MS",
                        help="latencies added by the proxy to every reply")
    parser.add_argument("--bandwidth", type=float, default=100.0, metavar="MB/S", help="the proxy's bandwidth cap")
    parser.add_argument("--cache-share", type=float, default=0.25, help="cache size of the block-shuffle run")
    parser.add_argument("--step-ms", type=float, default=None, help="simulated step per batch (default: half the "
                        "local Loader's time per batch)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="Loader threads (default: the cores this process may use)")
    parser.add_argument("--downloads", type=int, default=8, help="concurrent downloads")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every row (the table gives medians)")


def _epoch(loader: Any, device: SimAccelerator | None, built: float, settle: int = 10,
           fetched: Callable[[], int] | None = None) -> dict[str, float]:
    """One epoch with a simulated step after each batch: time to first batch, then images/s and stall share.

    The step is ``device``'s (None: no step) on a whole batch (``loader.batch_size`` images), whatever the batch's
    length: the step the table shows, per batch.

    Both count the batches after the first ``settle``: while the first shards arrive the prefetch queues fill up,
    and counting those batches would credit a slow start with a burst of batches decoded while it waited.
    ``fetched`` (a remote row's count of shards downloaded) is read when the timing starts, as ``fetched_before``:
    shards downloaded by then cost their download outside the timed batches.
    """
    waited, images, first, start = 0.0, 0, 0.0, time.perf_counter()
    ahead = 0
    before = start
    for number, batch in enumerate(loader):
        now = time.perf_counter()
        if number == 0:
            first = now - built
        if number == settle:
            start = now
            ahead = fetched() if fetched is not None else 0
        elif number > settle:
            waited += now - before
            images += len(batch[1])
        if device is not None:
            device.step(loader.batch_size)  # the device's step: no CPU, no GIL
        before = time.perf_counter()
    wall = time.perf_counter() - start
    return {"img_s": images / wall if wall else 0.0, "stall": waited / wall if wall else 0.0, "first_s": first,
            "fetched_before": ahead}


def _loader(source: str | Path, args: argparse.Namespace, **extra: Any) -> Any:
    from stallfree.pipeline.loader import Loader
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    spec = [RandomResizedCrop(160), RandomHorizontalFlip(), Normalize()]
    return Loader(source, args.batch_size, transform=spec, num_threads=args.threads, prefetch=4,
                  **{"shuffle": True, **extra})


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its rows (JSON-able)."""
    from stallfree.bench.servers import CONTROL
    from stallfree.bench.stores import s3_options
    from stallfree.ingest.manifest import read_manifest
    from stallfree.ingest.runner import ingest
    from stallfree.ingest.synthetic import make_image_folder
    from stallfree.ingest.writer import IngestOptions

    if args.images < 20 * args.batch_size or not 0 < args.cache_share <= 1 or args.repeats < 1:
        raise ValueError("--images must hold 20 batches (10 settle, 10 timed), --cache-share must be in (0, 1] "
                         "and --repeats at least 1")
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-remote-") as work_dir:
        work = Path(work_dir)
        print(f"writing and ingesting {args.images} synthetic JPEGs ...", file=sys.stderr)
        make_image_folder(work / "images", num_classes=8, per_class=math.ceil(args.images / 8),
                          size=tuple(args.size), vary_size=True, style="natural")
        data = work / "shards"
        ingest(work / "images", data, IngestOptions(shard_mb=args.shard_mb), workers=args.threads)
        shards = read_manifest(data)["shards"]
        total = sum(s["bytes"] for s in shards)
        _epoch(_loader(data, args), None, time.perf_counter())  # warm-up: page cache, graph compilation
        local = _epoch(_loader(data, args), None, time.perf_counter())
        step = args.step_ms / 1e3 if args.step_ms is not None else args.batch_size / local["img_s"] / 2
        device = SimAccelerator(args.batch_size / step) if step else None  # `step` seconds a batch (0: none)
        cache_limit = max(int(total * args.cache_share), 3 * max(s["bytes"] for s in shards))
        block = max(1, int(len(shards) * args.cache_share / 3))
        blocked = {"shuffle": "block", "block_shards": block}
        note = f", cache {args.cache_share:.0%}, block shuffle ({block} shards)"
        # (source, kind, added latency, Loader keywords, the local row it is compared with)
        local_block = f"local disk, block shuffle ({block} shards)"
        plans: list[tuple[str, str, float, dict[str, Any], str]] = [
            ("local disk", "local", 0.0, {}, "local disk"), (local_block, "local", 0.0, blocked, local_block)]
        for kind in ("HTTP", "S3"):
            plans += [(kind, kind, ms, {}, "local disk") for ms in args.latency]
            plans.append((f"{kind}{note}", kind, 20.0, {"cache_limit": cache_limit, **blocked}, local_block))
        runs: dict[tuple[str, float], list[dict[str, Any]]] = {}
        servers = subprocess.Popen([sys.executable, "-m", "stallfree.bench.servers", str(data),
                                    str(args.bandwidth * 1e6)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
        try:
            pipe = servers.stdout
            assert pipe is not None  # for mypy: it is a pipe
            proxies = json.loads(pipe.readline())
            for repeat in range(args.repeats):
                for number, (source, kind, ms, extra, _) in enumerate(plans):
                    print(f"run {repeat + 1}/{args.repeats}: {source} at {ms:g} ms ...", file=sys.stderr)
                    runs.setdefault((source, ms), []).append(
                        _run_one(data, kind, ms, extra, proxies, work / f"cache-{repeat}-{number}", device, args,
                                 CONTROL, s3_options, servers.pid))
        finally:
            servers.kill()
            servers.wait()
    rows = [_median_row(source, ms, runs[(source, ms)]) for source, _, ms, _, _ in plans]
    base = {row["source"]: row["img_s"] for row, plan in zip(rows, plans, strict=True) if plan[1] == "local"}
    for row, (_, _, _, _, against) in zip(rows, plans, strict=True):
        row["vs"], row["vs_local"] = against, row["img_s"] / base[against]
    print(f"{args.images} images ({total / 1e6:.1f} MB in {len(shards)} shards), batch {args.batch_size}, "
          f"{args.threads} threads, proxy cap {args.bandwidth:g} MB/s, simulated step {step * 1e3:.1f} ms/batch, "
          f"median of {args.repeats} runs", file=out)
    print("| source | added latency | img/s | runs | vs local | input-stall share | time to first batch | "
          "shards fetched (before timing) | CPU s: Loader, servers |", file=out)
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|", file=out)
    for row in rows:
        served = "-" if "fetched" not in row or row["servers_cpu_s"] is None else f"{row['servers_cpu_s']:.2f}"
        print(f"| {row['source']} | {row['latency_ms']:g} ms | {row['img_s']:.0f} | "
              f"{', '.join(f'{v:.0f}' for v in row['runs'])} | {row['vs_local']:.0%} | {row['stall']:.1%} | "
              f"{row['first_s']:.2f} s | {_fetched(row)} | {row['cpu_s']:.2f}, {served} |", file=out)
    print("vs local: against local disk with the same shuffle (the block rows against the block shuffle's)", file=out)
    print("CPU s: seconds of CPU in the epoch, of this process (Loader, downloads) and of the servers' process, "
          "on the same cores", file=out)
    print("before timing: shards downloaded before the 11th batch (median), whose downloads the img/s does not "
          "pay for; a row that fetched most of its shards before timing reads a warm cache (use more --images)",
          file=out)
    return {"images": args.images, "shards": len(shards), "bytes": total, "step_ms": step * 1e3,
            "repeats": args.repeats, "rows": rows}


def _run_one(data: Path, kind: str, ms: float, extra: dict[str, Any], proxies: dict[str, str], cache: Path,
             device: SimAccelerator | None, args: argparse.Namespace, control: str, s3_options: Any,
             servers: int) -> dict[str, Any]:
    """One row's epoch, with the CPU seconds this process and the servers' spent in it."""
    before, served = cpu_seconds(), cpu_seconds(servers)
    measured = _one_epoch(data, kind, ms, extra, proxies, cache, device, args, control, s3_options)
    after, served_after = cpu_seconds(), cpu_seconds(servers)
    measured["cpu_s"] = (after or 0.0) - (before or 0.0)
    measured["servers_cpu_s"] = served_after - served
    return measured


def _one_epoch(data: Path, kind: str, ms: float, extra: dict[str, Any], proxies: dict[str, str], cache: Path,
               device: SimAccelerator | None, args: argparse.Namespace, control: str,
               s3_options: Any) -> dict[str, Any]:
    """One epoch of one row: from local disk, or from a cold cache through the proxy at ``ms`` added latency."""
    if kind == "local":
        return _epoch(_loader(data, args, **extra), device, time.perf_counter())
    proxy = proxies[kind.lower()]
    urllib.request.urlopen(f"{proxy}{control}{ms:g}", timeout=10).close()
    url = proxy if kind == "HTTP" else "s3://bench/ds/"
    options = {"storage_options": s3_options(proxy)} if kind == "S3" else {}
    built = time.perf_counter()
    loader = _loader(url, args, cache_dir=cache, downloads=args.downloads, **options, **extra)
    try:
        measured: dict[str, Any] = _epoch(loader, device, built, fetched=lambda: loader.reader.cache.fetched)
        measured["fetched"] = loader.reader.cache.fetched
    finally:
        loader.close()
    return measured


def _fetched(row: dict[str, Any]) -> str:
    return f"{row['fetched']} ({row['fetched_before']:g})" if "fetched" in row else "-"


def _median_row(source: str, ms: float, runs: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"source": source, "latency_ms": ms, "runs": [r["img_s"] for r in runs]}
    for key in ("img_s", "stall", "first_s", "cpu_s"):
        row[key] = statistics.median(r[key] for r in runs)
    served = [r["servers_cpu_s"] for r in runs if r["servers_cpu_s"] is not None]
    row["servers_cpu_s"] = statistics.median(served) if served else None
    if "fetched" in runs[0]:
        row["fetched"] = max(r["fetched"] for r in runs)
        row["fetched_before"] = statistics.median(r["fetched_before"] for r in runs)
    return row
