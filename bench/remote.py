"""The Loader over the same shards on local disk, over HTTP and over S3, through a proxy adding latency.

One synthetic dataset is ingested once; the Loader then reads it from local disk, and from an HTTP server (with
Range) and moto's S3 server on 127.0.0.1 through the fault proxy at each ``--latency`` (ms added to every reply)
under a ``--bandwidth`` cap, each from a cold cache; last, with a cache of ``--cache-share`` of the dataset and
``shuffle="block"``. A simulated training step (``--step-ms``, default half the local Loader's time per batch)
follows every batch, so the input-stall share means what it does in training: the share of the loop's time spent
waiting in ``next(loader)``. Images/s and the stall share count from the 11th batch on, once the first shards
have arrived and the prefetch queues have filled; the time to first batch is measured from the Loader's
construction. The servers run in a process of their own, so they take no interpreter time from the Loader.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, TextIO

__all__ = ["add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench remote                                   # 1,200 synthetic images, 0/20/100 ms, 100 MB/s
  stallfree bench remote --images 4000 --latency 0 50 --bandwidth 25 --json | jq .rows
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
    parser.add_argument("--downloads", type=int, default=4, help="concurrent downloads")


def _epoch(loader: Any, step: float, built: float, settle: int = 10) -> dict[str, float]:
    """One epoch with a simulated step after each batch: time to first batch, then images/s and stall share.

    Both count the batches after the first ``settle``: while the first shards arrive the prefetch queues fill up,
    and counting those batches would credit a slow start with a burst of batches decoded while it waited.
    """
    waited, images, first, start = 0.0, 0, 0.0, time.perf_counter()
    before = start
    for number, batch in enumerate(loader):
        now = time.perf_counter()
        if number == 0:
            first = now - built
        if number == settle:
            start = now
        elif number > settle:
            waited += now - before
            images += len(batch[1])
        time.sleep(step)
        before = time.perf_counter()
    wall = time.perf_counter() - start
    return {"img_s": images / wall if wall else 0.0, "stall": waited / wall if wall else 0.0, "first_s": first}


def _loader(source: str | Path, args: argparse.Namespace, **extra: Any) -> Any:
    from stallfree import Loader
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    spec = [RandomResizedCrop(160), RandomHorizontalFlip(), Normalize()]
    return Loader(source, args.batch_size, transform=spec, num_threads=args.threads, prefetch=4, **extra)


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its rows (JSON-able)."""
    from stallfree.bench.servers import CONTROL, s3_options
    from stallfree.ingest.manifest import read_manifest
    from stallfree.ingest.runner import ingest
    from stallfree.ingest.synthetic import make_image_folder
    from stallfree.ingest.writer import IngestOptions

    if args.images < 20 * args.batch_size or not 0 < args.cache_share <= 1:
        raise ValueError("--images must hold 20 batches (10 settle, 10 timed) and --cache-share must be in (0, 1]")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-remote-") as work_dir:
        work = Path(work_dir)
        print(f"writing and ingesting {args.images} synthetic JPEGs ...", file=sys.stderr)
        make_image_folder(work / "images", num_classes=8, per_class=math.ceil(args.images / 8),
                          size=tuple(args.size), vary_size=True, style="natural")
        data = work / "shards"
        ingest(work / "images", data, IngestOptions(shard_mb=args.shard_mb), workers=args.threads)
        shards = read_manifest(data)["shards"]
        total = sum(s["bytes"] for s in shards)
        _epoch(_loader(data, args), 0.0, time.perf_counter())  # warm-up: page cache, graph compilation
        built = time.perf_counter()
        local = _epoch(_loader(data, args), 0.0, built)
        per_batch = args.batch_size / local["img_s"]
        step = args.step_ms / 1e3 if args.step_ms is not None else per_batch / 2
        built = time.perf_counter()
        rows.append({"source": "local disk", "latency_ms": 0, **_epoch(_loader(data, args), step, built)})
        cache_limit = max(int(total * args.cache_share), 3 * max(s["bytes"] for s in shards))
        block = max(1, int(len(shards) * args.cache_share / 3))
        servers = subprocess.Popen([sys.executable, "-m", "stallfree.bench.servers", str(data),
                                    str(args.bandwidth * 1e6)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
        try:
            pipe = servers.stdout
            assert pipe is not None  # for mypy: it is a pipe
            proxies = json.loads(pipe.readline())
            for kind in ("HTTP", "S3"):
                proxy = proxies[kind.lower()]
                plans: list[tuple[float, dict[str, Any], str]] = [(ms, {}, "") for ms in args.latency]
                plans.append((20.0, {"cache_limit": cache_limit, "shuffle": "block", "block_shards": block},
                              f", cache {args.cache_share:.0%}, block shuffle ({block} shards)"))
                for ms, extra, note in plans:
                    urllib.request.urlopen(f"{proxy}{CONTROL}{ms:g}", timeout=10).close()
                    url = proxy if kind == "HTTP" else "s3://bench/ds/"
                    options = {"storage_options": s3_options(proxy)} if kind == "S3" else {}
                    print(f"{kind} at {ms:g} ms{note} ...", file=sys.stderr)
                    built = time.perf_counter()
                    loader = _loader(url, args, cache_dir=work / f"cache-{len(rows)}", downloads=args.downloads,
                                     **options, **extra)
                    measured = _epoch(loader, step, built)
                    measured["fetched"] = loader.reader.cache.fetched
                    loader.close()
                    rows.append({"source": f"{kind}{note}", "latency_ms": ms, **measured})
        finally:
            servers.kill()
            servers.wait()
    base = rows[0]["img_s"]
    print(f"{args.images} images ({total / 1e6:.1f} MB in {len(shards)} shards), batch {args.batch_size}, "
          f"{args.threads} threads, proxy cap {args.bandwidth:g} MB/s, simulated step {step * 1e3:.1f} ms/batch",
          file=out)
    print("| source | added latency | img/s | vs local | input-stall share | time to first batch | shards fetched |",
          file=out)
    print("|---|---:|---:|---:|---:|---:|---:|", file=out)
    for row in rows:
        print(f"| {row['source']} | {row['latency_ms']:g} ms | {row['img_s']:.0f} | {row['img_s'] / base:.0%} | "
              f"{row['stall']:.1%} | {row['first_s']:.2f} s | {row.get('fetched', '-')} |", file=out)
    return {"images": args.images, "shards": len(shards), "bytes": total, "step_ms": step * 1e3, "rows": rows}
