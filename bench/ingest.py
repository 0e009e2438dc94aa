"""Ingest throughput (images/s, MB/s) by worker count, and the Loader over shards beside folders and torch.

Part one ingests the same ImageFolder into a fresh output folder once per ``--workers`` value and reports images/s
and source MB/s of each run (the page cache is warmed by a listing pass first, so that the first run is not alone
in paying for cold reads).

Part two (``--loader``) ingests the folder twice (as it is, and with ``--max-side 256``) and times, in one run,
with the same augmentation (RandomResizedCrop(224), flip, normalize; batch 64): the Loader over the folder, over
the shards, over the ``--max-side 256`` shards, and torch's DataLoader over the original folder. It uses the
contenders and the timing of ``stallfree bench loader``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any, TextIO

__all__ = ["EXAMPLES", "add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench ingest ./bench-data --synthetic 1000 --workers 1 2
  stallfree bench ingest ./bench-data --synthetic 2000 --loader --batches 20 --json-file ingest.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    cores = len(os.sched_getaffinity(0))
    parser.add_argument("data", type=Path, help="an ImageFolder tree of JPEGs")
    parser.add_argument("--synthetic", type=int, metavar="N", default=0,
                        help="first write N synthetic ImageNet-sized JPEGs (about 0.19 MP) into DATA if it is empty")
    parser.add_argument("--workers", type=int, nargs="+", default=sorted({1, cores}),
                        help="worker counts to ingest with (default: 1 and the cores this process may use)")
    parser.add_argument("--max-side", type=int, default=None, help="ingest with --max-side N in part one")
    parser.add_argument("--out", type=Path, help="where to write shards (default: a temporary folder, removed)")
    parser.add_argument("--loader", action="store_true", help="also time the Loader over folder and shards")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch")
    parser.add_argument("--batches", type=int, default=20, help="batches per timed pass (--loader)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per contender (--loader)")
    parser.add_argument("--threads", type=int, default=cores, help="Loader threads / DataLoader workers (--loader)")
    parser.add_argument("--device", default="cpu", help="where batches are delivered (--loader)")


def _ingest_rates(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    import pyarrow as pa

    from stallfree.ingest.runner import ingest
    from stallfree.ingest.writer import IngestOptions

    for path in sorted(args.data.rglob("*")):  # warm the page cache for every run alike
        if path.is_file():
            path.read_bytes()
    pa.array([0])  # pyarrow's first call imports pandas (most of a second): not inside the first timed run
    rows = []
    for workers in args.workers:
        out = work / f"ingest-w{workers}"
        shutil.rmtree(out, ignore_errors=True)
        summary = ingest(args.data, out, IngestOptions(shard_mb=64, max_side=args.max_side), workers=workers)
        rows.append({"workers": workers, **summary})
        shutil.rmtree(out, ignore_errors=True)
    return rows


def _loader_rates(args: argparse.Namespace, work: Path) -> dict[str, list[float]]:
    from stallfree.bench import loader as bench_loader

    runs = [("stallfree, folder", "stallfree", args.data), *bench_loader.shard_runs(args, work),
            ("torch DataLoader, folder", "torch", args.data)]
    return bench_loader.measure_runs(runs, args)


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its tables to ``out`` and return its results (JSON-able)."""
    from stallfree.bench.loader import write_synthetic

    write_synthetic(args.data, args.synthetic)
    if any(w < 1 for w in args.workers) or args.batches < 1 or args.repeats < 1:
        raise ValueError(f"--workers, --batches and --repeats must be positive, got {args.workers}, "
                         f"{args.batches}, {args.repeats}")
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-ingest-") as tmp:
        work = args.out or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = _ingest_rates(args, work)
        print(f"ingest of {args.data} ({rows[0]['images']} images, {rows[0]['source_mb']:.0f} MB)"
              + (f", --max-side {args.max_side}" if args.max_side else ""), file=out)
        print(f"| {'workers':>7} | {'images/s':>9} | {'MB/s':>7} | {'seconds':>7} | {'vs 1 worker':>11} |", file=out)
        print(f"|{'-' * 8}:|{'-' * 10}:|{'-' * 8}:|{'-' * 8}:|{'-' * 12}:|", file=out)
        first = rows[0]["images_per_s"]
        for row in rows:
            print(f"| {row['workers']:>7} | {row['images_per_s']:>9.0f} | {row['mb_per_s']:>7.1f} | "
                  f"{row['seconds']:>7.1f} | {row['images_per_s'] / first:>10.2f}x |", file=out)
        result: dict[str, Any] = {"ingest": rows}
        if args.loader:
            rates = _loader_rates(args, work)
            medians = {label: statistics.median(r) for label, r in rates.items()}
            torch_rate = medians["torch DataLoader, folder"]
            print(f"\nLoader sources, batch {args.batch_size}, {args.threads} threads, {args.device}, "
                  f"median of {args.repeats} x {args.batches} batches", file=out)
            print(f"| {'source':<30} | {'img/s (median)':>14} | {'vs torch DataLoader':>19} |", file=out)
            print(f"|{'-' * 32}|{'-' * 15}:|{'-' * 20}:|", file=out)
            for label, median in medians.items():
                print(f"| {label:<30} | {median:>14.0f} | {median / torch_rate:>18.2f}x |", file=out)
            result["loader"] = {"runs": rates, "median": medians}
    return result
