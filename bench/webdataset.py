"""WebDataset tars read in place against the same images ingested: index time, and the Loader's images/s.

Synthetic JPEGs are written once, packed into ``--tars`` WebDataset tars (``.jpg`` + ``.cls`` per sample) and
ingested into Arrow shards. The tars are then indexed from a cold index cache and again from the warm one, on
local disk and over HTTP and S3 (moto) on 127.0.0.1 through the fault proxy (``--latency`` ms added to every
reply, ``--bandwidth`` cap); the servers run in a process of their own, so they take no interpreter time from the
Loader. Last, one epoch of the Loader (after a warm-up epoch over the local shards) over each source: the ingested
shards on local disk, the tars on local disk, over HTTP and over S3, each under a global and a block shuffle
(``--shuffle``). Images/s counts from the 3rd batch on.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, TextIO

__all__ = ["add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench webdataset                               # 1,200 synthetic images in 12 tars, 20 ms latency
  stallfree bench webdataset --downloads 16 --shuffle global  # 16 ranged reads in flight
  stallfree bench webdataset --images 4000 --tars 40 --latency 0 --json | jq .rows
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--images", type=int, default=1200, help="synthetic JPEGs in the dataset")
    parser.add_argument("--size", type=int, nargs=2, default=(240, 320), metavar=("H", "W"), help="their size")
    parser.add_argument("--tars", type=int, default=12, help="WebDataset tars the images are packed into")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch")
    parser.add_argument("--latency", type=float, default=20.0, metavar="MS", help="latency the proxy adds to replies")
    parser.add_argument("--bandwidth", type=float, default=100.0, metavar="MB/S", help="the proxy's bandwidth cap")
    parser.add_argument("--io-threads", type=int, default=4, help="the Loader's io_threads")
    parser.add_argument("--downloads", type=int, default=None, help="ranged requests in flight for the tars at a URL "
                        "(default: the Loader's, 64); a global shuffle's rate is at most downloads / latency")
    parser.add_argument("--shuffle", choices=("global", "block", "both"), default="both",
                        help="the Loader's shuffle over the tars (block: 2 tars a block); both: a row each")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="Loader threads (default: the cores this process may use)")


def _pack(images: Path, out: Path, count: int) -> str:
    """The ImageFolder ``images`` as ``count`` tars in ``out`` (files dealt round-robin); their pattern."""
    out.mkdir(parents=True)
    files = sorted(images.glob("*/*.jpg"))
    classes = sorted({f.parent.name for f in files})
    width = len(str(count - 1))
    for t in range(count):
        with tarfile.open(out / f"train-{t:0{width}d}.tar", "w") as tar:
            for file in files[t::count]:
                key = f"{file.parent.name}-{file.stem}"
                tar.add(file, f"{key}.jpg")
                label = tarfile.TarInfo(f"{key}.cls")
                text = str(classes.index(file.parent.name)).encode()
                label.size = len(text)
                tar.addfile(label, io.BytesIO(text))
    return f"train-{{{0:0{width}d}..{count - 1:0{width}d}}}.tar"


def _index_times(source: str, cache: Path, options: dict[str, Any]) -> tuple[float, float]:
    """Seconds to index the tars from a cold index cache, then from the warm one."""
    from stallfree.pipeline.webdataset import WebDatasetReader

    times = []
    for _ in range(2):
        start = time.perf_counter()
        WebDatasetReader(source, cache_dir=cache, **options)
        times.append(time.perf_counter() - start)
    return times[0], times[1]


def _epoch_rate(source: str | Path, args: argparse.Namespace, settle: int = 2, **extra: Any) -> float:
    """Images/s of one epoch of the Loader over ``source``, from batch ``settle`` on."""
    from stallfree.pipeline.loader import Loader
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    spec = [RandomResizedCrop(160), RandomHorizontalFlip(), Normalize()]
    loader = Loader(source, args.batch_size, transform=spec, num_threads=args.threads, prefetch=4,
                    io_threads=args.io_threads, **{"shuffle": True, **extra})
    images, start = 0, time.perf_counter()
    for number, (_, labels) in enumerate(loader):
        if number == settle:
            start = time.perf_counter()
        elif number > settle:
            images += len(labels)
    loader.close()
    return images / (time.perf_counter() - start)


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its rows (JSON-able)."""
    from stallfree.bench.servers import CONTROL
    from stallfree.bench.stores import s3_options
    from stallfree.ingest.runner import ingest
    from stallfree.ingest.synthetic import make_image_folder

    if args.tars < 1 or args.images < max(args.tars, 6 * args.batch_size):
        raise ValueError("--tars must be >= 1 and --images must hold 6 batches and one image per tar")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-webdataset-") as work_dir:
        work = Path(work_dir)
        print(f"writing {args.images} synthetic JPEGs into {args.tars} tars, and ingesting them ...", file=sys.stderr)
        make_image_folder(work / "images", num_classes=8, per_class=math.ceil(args.images / 8),
                          size=tuple(args.size), vary_size=True, style="natural")
        pattern = _pack(work / "images", work / "tars", args.tars)
        total = sum(p.stat().st_size for p in (work / "tars").glob("*.tar"))
        ingest(work / "tars", work / "shards", workers=args.threads)
        servers = subprocess.Popen([sys.executable, "-m", "stallfree.bench.servers", str(work / "tars"),
                                    str(args.bandwidth * 1e6)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
        try:
            pipe = servers.stdout
            if pipe is None:
                raise RuntimeError("the servers' process has no stdout pipe")
            proxies = json.loads(pipe.readline())
            for proxy in proxies.values():
                urllib.request.urlopen(f"{proxy}{CONTROL}{args.latency:g}", timeout=10).close()
            ahead = {} if args.downloads is None else {"downloads": args.downloads}
            stores: list[tuple[str, str, dict[str, Any]]] = [
                ("tars, local disk", str(work / "tars" / pattern), {}),
                ("tars, HTTP", f"{proxies['http']}/{pattern}", ahead),
                ("tars, S3", f"s3://bench/ds/{pattern}", {"storage_options": s3_options(proxies["s3"]), **ahead})]
            shuffles = ["global", "block"] if args.shuffle == "both" else [args.shuffle]
            print("warm-up epoch ...", file=sys.stderr)
            _epoch_rate(work / "shards", args)  # the page cache, the graph's compilation
            print("ingested shards, local disk ...", file=sys.stderr)
            rows.append({"source": "ingested shards, local disk", "shuffle": "global", "index_cold_s": None,
                         "index_warm_s": None, "img_s": _epoch_rate(work / "shards", args)})
            for number, (name, source, options) in enumerate(stores):
                cache = work / f"index-{number}"
                print(f"{name}: index ...", file=sys.stderr)
                cold, warm = _index_times(source, cache, {k: v for k, v in options.items() if k != "downloads"})
                for shuffle in shuffles:
                    print(f"{name}, {shuffle} shuffle ...", file=sys.stderr)
                    rate = _epoch_rate(source, args, cache_dir=cache, shuffle=shuffle, block_shards=2, **options)
                    rows.append({"source": name, "shuffle": shuffle, "index_cold_s": cold, "index_warm_s": warm,
                                 "img_s": rate})
        finally:
            servers.kill()
            servers.wait()
    base = rows[0]["img_s"]
    print(f"{args.images} images ({total / 1e6:.1f} MB in {args.tars} tars), batch {args.batch_size}, "
          f"{args.threads} threads, io_threads {args.io_threads}, downloads {args.downloads or 'default (64)'}, "
          f"proxy {args.latency:g} ms, cap {args.bandwidth:g} MB/s", file=out)
    print("| source | shuffle | index, cold | index, cached | img/s | vs ingested |", file=out)
    print("|---|---|---:|---:|---:|---:|", file=out)
    for row in rows:
        first = "-" if row["index_cold_s"] is None else f"{row['index_cold_s']:.2f} s"
        again = "-" if row["index_warm_s"] is None else f"{row['index_warm_s']:.2f} s"
        print(f"| {row['source']} | {row['shuffle']} | {first} | {again} | {row['img_s']:.0f} | "
              f"{row['img_s'] / base:.0%} |", file=out)
    return {"images": args.images, "tars": args.tars, "bytes": total, "rows": rows}
