"""Start-up cost per rank at ImageNet size and beyond: Loader construction over shards, first order, reader.

Generates the index, not the images: Arrow shards as ``stallfree ingest`` writes them (``key``, ``label``,
``image``, ``height``, ``width``; ``--rows-per-shard`` rows each, 2,048 by default, what 256 MB shards of ~125 KB
ImageNet JPEGs hold) whose ``image`` is a 16-byte stand-in, ``labels.npy`` and the manifest, for ``--samples`` samples
(1,281,167 by default, ImageNet's train split). Then, ``--repeats`` times, each in a fresh process so that its
memory is one rank's alone, it measures rank 0 of ``--world-size``:

- **construction**: ``Loader(DIR, 256, transform=[RandomResizedCrop(224), RandomHorizontalFlip(), Normalize()])``,
  wall time and the growth of the process's peak RSS over what it had after its imports (mapped shard pages it
  touches included); then a second construction under ``tracemalloc`` for the peak of Python's allocations
  (NumPy's included; tracing slows allocation, so it is not the timed one);
- **first order**: the rank's sample ids for epoch 0 (``sampler.virtual_order(0)``), which is all the sampler
  computes before the first batch: its wall time, then its peak allocations under ``tracemalloc`` in a second call
  (the rank's order itself, int64, is what it must hold: 100 MB for 12.5M ids); ``--shuffle block`` measures the
  block shuffle's order (``--block-shards`` shards a block) instead of the global one;
- **reader**: ``reader.read(row)`` per sample over the rank's first ``--reads`` rows, once their shards are verified
  (a first pass hashes them, then the timed pass).

The table shows the median of the repeats. ``--keep DIR`` keeps the index for the next run.

``--listing FILES`` measures ingest's listing instead: a generated image folder of ``FILES`` empty files in 100
classes, listed as a one-part ingest lists it and as part 0 of ``--parts`` (``plan_source``), median time of
``--repeats`` and the listing's peak allocations (tracemalloc), per file of the whole source.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, TextIO

__all__ = ["add_arguments", "generate_index", "run"]

EXAMPLES = """examples:
  stallfree bench scale
  stallfree bench scale --samples 100000000 --world-size 8 --keep /data/index-100m --repeats 3
  stallfree bench scale --samples 10000000 --shuffle block     # the block shuffle's first order
  stallfree bench scale --listing 100000 --parts 10     # ingest's listing, whole and one part of 10
"""

IMAGENET = 1_281_167
_IMAGE = bytes(range(16))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--samples", type=int, default=IMAGENET, help=f"samples in the index (default {IMAGENET})")
    parser.add_argument("--rows-per-shard", type=int, default=2048, help="rows per shard (default 2048)")
    parser.add_argument("--world-size", type=int, default=8, help="ranks the Loader is sharded over (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes measured (default 3)")
    parser.add_argument("--reads", type=int, default=20000, help="rows read for the reader's cost (default 20000)")
    parser.add_argument("--shuffle", choices=("global", "block"), default="global",
                        help="the Loader's shuffle measured (default global)")
    parser.add_argument("--block-shards", type=int, default=8, help="with --shuffle block: shards a block (default 8)")
    parser.add_argument("--keep", type=Path, help="generate the index here (or reuse it) and keep it")
    parser.add_argument("--listing", type=int, metavar="FILES", default=0,
                        help="measure ingest's listing of a generated folder of FILES empty files instead")
    parser.add_argument("--parts", type=int, default=10, help="with --listing: the split measured (default 10)")


def _listing(files: int, parts: int, repeats: int, out: TextIO) -> dict[str, Any]:
    """Ingest's listing of a generated folder of ``files`` empty files: whole, and as part 0 of ``parts``."""
    import tracemalloc

    from stallfree.ingest.sources import plan_source

    classes = 100
    rows = []
    with tempfile.TemporaryDirectory(prefix="stallfree-listing-") as tmp:
        for c in range(classes):
            folder = Path(tmp) / f"class{c:03d}"
            folder.mkdir()
            for i in range(files * c // classes, files * (c + 1) // classes):
                (folder / f"{i:09d}.jpg").touch()
        print(f"listing a folder of {files:,} empty files in {classes} classes, medians of {repeats}:", file=out)
        for part in ((0, 1), (0, parts)):
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                listed = len(plan_source(tmp, part=part).items)
                times.append(time.perf_counter() - start)
            tracemalloc.start()
            plan_source(tmp, part=part)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            row = {"part": f"{part[0]}/{part[1]}", "listed": listed, "seconds": statistics.median(times),
                   "us_per_source_file": statistics.median(times) / files * 1e6, "peak_mb": peak / 1e6}
            rows.append(row)
            print(f"  part {row['part']:>6}: {listed:>10,} listed in {row['seconds']:7.3f} s "
                  f"({row['us_per_source_file']:5.2f} us a file of the source), peak {row['peak_mb']:7.1f} MB",
                  file=out)
    return {"listing": files, "parts": parts, "rows": rows}


def generate_index(out: Path, samples: int, rows_per_shard: int, classes: int = 1000) -> None:
    """Write ``samples`` rows of index (16-byte stand-in images) as shards and a manifest into ``out``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.ipc as ipc
    from tqdm import tqdm

    from stallfree.ingest.labels import save_labels, smallest_dtype
    from stallfree.ingest.manifest import FORMAT, MANIFEST, VERSION, file_sha256, shard_name, write_manifest
    from stallfree.ingest.writer import BATCH_ROWS, IngestOptions, _schema

    options = IngestOptions()
    schema = _schema([], options)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    shards = range(0, samples, rows_per_shard)
    for index, start in enumerate(tqdm(shards, desc="index", unit="shard", file=sys.stderr, dynamic_ncols=True,
                                       disable=len(shards) < 100)):
        rows = np.arange(start, min(samples, start + rows_per_shard), dtype=np.int64)
        path = out / shard_name(index)
        with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, schema) as writer:
            for lo in range(0, len(rows), BATCH_ROWS):
                part = rows[lo : lo + BATCH_ROWS]
                n = len(part)
                offsets = pa.array(np.arange(n + 1, dtype=np.int32) * len(_IMAGE))
                columns = {
                    "key": pa.array([f"{c}/{r}.JPEG" for c, r in zip((part % classes).tolist(), part.tolist(),
                                                                       strict=True)]),
                    "label": pa.array(part % classes),
                    "image": pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets.buffers()[1],
                                                                          pa.py_buffer(_IMAGE * n)]),
                    "height": pa.array(np.full(n, 375, np.int32)),
                    "width": pa.array(np.full(n, 500, np.int32)),
                }
                writer.write_batch(pa.record_batch([columns[f.name] for f in schema], schema=schema))
        entries.append({"file": path.name, "rows": len(rows), "bytes": path.stat().st_size,
                        "sha256": file_sha256(path)})
    labels = np.arange(samples, dtype=np.int64) % classes  # the label column's values, as ingest writes them
    write_manifest(out / MANIFEST, {
        "labels": save_labels(out, labels.astype(smallest_dtype(labels))),
        "format": FORMAT, "version": VERSION, "plan": {"digest": "bench-scale", "shards": len(entries)},
        "schema": [{"name": f.name, "type": str(f.type)} for f in schema],
        "image": {"kind": "encoded", "shape": None}, "shards": entries, "rows": samples,
        "classes": [f"c{i:04d}" for i in range(classes)], "class_counts": [], "source": {"kind": "bench-scale"},
        "options": options.to_json(), "source_bytes": 0, "rejected": 0,
    })


def _measure(folder: str, world_size: int, reads: int, shuffle: str = "global",
             block_shards: int = 8) -> dict[str, Any]:
    """One rank's costs, in this (fresh) process."""
    import resource
    import tracemalloc

    import psutil

    from stallfree.pipeline.loader import Loader
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    spec = [RandomResizedCrop(224), RandomHorizontalFlip(), Normalize()]
    with tempfile.TemporaryDirectory() as tiny:  # imports and first-time set-up on a 16-row index, untimed
        generate_index(Path(tiny), 16, 16)
        Loader(tiny, 4, transform=spec)
    base_rss = psutil.Process().memory_info().rss
    base_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    mode: Literal["block"] | bool = "block" if shuffle == "block" else True
    loader = Loader(folder, 256, transform=spec, shuffle=mode, block_shards=block_shards, rank=0,
                    world_size=world_size)
    construct = time.perf_counter() - start
    peak, now = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, psutil.Process().memory_info().rss
    top = peak if peak > base_peak else now  # a peak set during construction, else the RSS it left
    del loader
    tracemalloc.start()  # a second construction, traced (tracing slows allocation: the first one is the timed one)
    loader = Loader(folder, 256, transform=spec, shuffle=mode, block_shards=block_shards, rank=0,
                    world_size=world_size)
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    start = time.perf_counter()
    order = loader.sampler.virtual_order(0)
    first_order = time.perf_counter() - start
    del order
    tracemalloc.start()  # again, traced: what the order costs besides the rank's ids it returns
    order = loader.sampler.virtual_order(0)
    _, order_traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rows = loader.sampler.rows(order[:reads]).tolist()
    reader = loader.reader
    for row in rows:  # verifies every shard these rows touch
        reader.read(row)
    start = time.perf_counter()
    for row in rows:
        reader.read(row)
    per_read = (time.perf_counter() - start) / max(1, len(rows))
    return {"construct_s": construct, "traced_peak_mb": traced / 1e6,
            "rss_growth_mb": (top - base_rss) / 1e6,
            "first_order_s": first_order, "order_peak_mb": order_traced / 1e6, "order_mb": order.nbytes / 1e6,
            "rank_samples": len(order), "read_us": per_read * 1e6}


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Generate (or reuse) the index, measure ``--repeats`` fresh processes, print and return the medians."""
    for name in ("samples", "rows_per_shard", "world_size", "repeats", "reads", "parts", "block_shards"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.listing < 0:
        raise ValueError(f"--listing must be >= 0, got {args.listing}")
    if args.listing:
        return _listing(args.listing, args.parts, args.repeats, out)
    folder = args.keep if args.keep is not None else Path(tempfile.mkdtemp(prefix="stallfree-scale-"))
    try:
        start = time.perf_counter()
        manifest = folder / "manifest.json"
        found = json.loads(manifest.read_text()) if manifest.is_file() else {}
        reused = found.get("rows") == args.samples and "labels" in found  # one without labels.npy: older stallfree
        if not reused:
            generate_index(folder, args.samples, args.rows_per_shard)
        print(f"index of {args.samples:,} samples {'reused' if reused else 'generated'} in {folder} "
              f"({time.perf_counter() - start:.1f} s)", file=out)
        runs = []
        with tempfile.TemporaryDirectory(prefix="stallfree-scale-cache-") as cache:
            env = {**os.environ, "STALLFREE_CACHE_DIR": cache}  # the first run hashes, as a fresh job does
            result = Path(cache) / "result.json"
            for _ in range(args.repeats):
                code = ("import json, pathlib, sys; from stallfree.bench.scale import _measure; "
                        "pathlib.Path(sys.argv[4]).write_text(json.dumps(_measure(sys.argv[1], int(sys.argv[2]), "
                        "int(sys.argv[3]), sys.argv[5], int(sys.argv[6]))))")
                done = subprocess.run([sys.executable, "-c", code, str(folder), str(args.world_size), str(args.reads),
                                       str(result), args.shuffle, str(args.block_shards)],
                                      capture_output=True, text=True, env=env, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"the measuring process failed ({done.returncode}): {done.stderr[-2000:]}")
                runs.append(json.loads(result.read_text()))
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    median = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print(f"rank 0 of {args.world_size} ({int(median['rank_samples']):,} samples), medians of {len(runs)} processes:",
          file=out)
    print(f"  Loader construction  {median['construct_s']:8.3f} s", file=out)
    print(f"  traced peak          {median['traced_peak_mb']:8.1f} MB (Python and NumPy allocations)", file=out)
    print(f"  RSS growth           {median['rss_growth_mb']:8.1f} MB (peak over the after-import RSS)", file=out)
    shuffled = f"{args.shuffle}" + (f", {args.block_shards} shards a block" if args.shuffle == "block" else "")
    print(f"  first order          {median['first_order_s']:8.3f} s ({shuffled})", file=out)
    print(f"  first order's peak   {median['order_peak_mb']:8.1f} MB traced (the rank's ids: "
          f"{median['order_mb']:.1f} MB)", file=out)
    print(f"  reader per sample    {median['read_us']:8.2f} us", file=out)
    return {"samples": args.samples, "world_size": args.world_size, "rows_per_shard": args.rows_per_shard,
            "shuffle": args.shuffle, "block_shards": args.block_shards, "median": median, "runs": runs}
