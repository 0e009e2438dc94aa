"""Where a Loader batch's time goes: each stage's cost per image on one core, beside the whole Loader's rate.

The Loader's work for one image, stage by stage, each timed alone on one thread over the same images (DATA's
JPEGs, page cache warm, the ImageNet train spec: RandomResizedCrop(224), flip, normalize, float32 NCHW):

- on the host, in Python: **read** (the reader's ``read`` of the file's bytes), **header check** (the one image
  check, ``read_header``), **parameter draws** (the spec's per-sample draws, keyed by sample);
- in DALI with one thread, each graph a prefix of the next, so a stage's cost is the difference between two:
  **decode, whole image** (``fn.decoders.image``: what a loader that decodes everything pays, for reference),
  **decode, crop window** (``fn.decoders.image_slice`` on the drawn windows: the Loader's decode), **+ resize**
  (the Loader's graph for RandomResizedCrop alone, whose resampler writes the float32 NCHW output itself,
  scaled to [0, 1]), **+ flip, normalize** (the whole graph: the same operator, mirrored and normalized), and the
  **hand-off** to torch (DLPack, timed alone).

The Loader is then run whole with ``--threads`` threads, as ``bench loader`` runs it (one warm-up pass, then the
timed passes): the sum of the stages over the cores it has is what it
would reach if they overlapped perfectly; the difference is the pipeline's own cost (queues, the GIL, threads
waiting on each other). Times are medians of ``--repeats`` passes of ``--batches`` batches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

__all__ = ["add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench breakdown ./bench-data --synthetic 1000
  stallfree bench breakdown ~/imagenet/train --batches 10 --json-file breakdown.json
"""

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("data", type=Path, help="an ImageFolder tree of JPEGs")
    parser.add_argument("--synthetic", type=int, metavar="N", default=0,
                        help="first write N synthetic ImageNet-like JPEGs into DATA if it is empty")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch")
    parser.add_argument("--batches", type=int, default=5, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per stage (the median is shown)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads for the whole Loader (default: the cores this process may use)")


def _median_us(work: Callable[[], Any], images: int, repeats: int) -> float:
    """Microseconds per image of ``work`` (which handles ``images`` images): the median of ``repeats`` runs."""
    work()  # warm-up: first-use costs (a compile, a cache) are not the steady state
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        runs.append((time.perf_counter() - start) / images * 1e6)
    return statistics.median(runs)


def _spec(full: bool) -> list[Any]:
    from stallfree.bench.loader import MEAN, STD
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    return [RandomResizedCrop(224), RandomHorizontalFlip(), Normalize(MEAN, STD)] if full else [RandomResizedCrop(224)]


def _graph(full: bool, batch_size: int) -> tuple[Any, Any]:
    """The Loader's own graph for the full spec, or for RandomResizedCrop alone, on one CPU thread."""
    from stallfree.pipeline.graph import Graph
    from stallfree.transforms.compile import CompiledTransforms

    compiled = CompiledTransforms(_spec(full), dtype="float32", layout="NCHW")
    return compiled, Graph(compiled, batch_size=batch_size, num_threads=1, device_id=None, encoded=True, seed=0)


def _decoder(batch_size: int, window: bool) -> Any:
    """A one-thread CPU DALI pipeline that decodes whole images, or only each image's crop window."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, exec_dynamic=True, prefetch_queue_depth=1)
    def pipeline() -> Any:
        jpegs = fn.external_source(name="images", dtype=types.UINT8)
        if not window:
            return fn.decoders.image(jpegs, output_type=types.RGB)
        win = fn.external_source(name="window", dtype=types.INT32)
        return fn.decoders.image_slice(jpegs, win[0:2], win[2:4], axis_names="HW", normalized_anchor=False,
                                       normalized_shape=False, output_type=types.RGB)

    pipe = pipeline()
    pipe.build()
    return pipe


def _stages(args: argparse.Namespace, bar: Any) -> dict[str, float]:
    """Microseconds per image of each stage, on one thread."""
    import numpy as np

    from stallfree.ingest.images import read_header
    from stallfree.pipeline.reader_base import sample_of
    from stallfree.pipeline.readers import open_source
    from stallfree.transforms.random import batch_random

    reader = open_source(args.data)
    n = args.batch_size * args.batches
    rows = [i % len(reader) for i in range(n)]
    batches = [rows[i : i + args.batch_size] for i in range(0, n, args.batch_size)]
    data = [sample_of(reader.read(r))["image"] for r in rows]
    sizes = [(h.height, h.width) for h in (read_header(d) for d in data)]
    crop, crop_graph = _graph(False, args.batch_size)
    full, full_graph = _graph(True, args.batch_size)
    def draws(compiled: Any) -> list[dict[str, Any]]:
        step = args.batch_size
        return [compiled.draw(batch_random(0, 0, b), sizes[i * step : (i + 1) * step]) for i, b in enumerate(batches)]

    drawn, full_drawn = draws(crop), draws(full)
    images = [data[i : i + args.batch_size] for i in range(0, n, args.batch_size)]

    def decode(pipe: Any, with_window: bool) -> Callable[[], Any]:
        def work() -> None:
            for batch, params in zip(images, drawn, strict=True):
                pipe.feed_input("images", batch)
                if with_window:
                    pipe.feed_input("window", [np.asarray(w, np.int32) for w in params["0.window"]])
                pipe.run()
        return work

    def through(graph: Any, params: list[dict[str, Any]]) -> Callable[[], Any]:
        def work() -> None:
            for batch, p in zip(images, params, strict=True):
                graph._run_on(graph._pipe, batch, p)
        return work

    outputs = [full_graph._run_on(full_graph._pipe, images[0], full_drawn[0])]

    def hand_off() -> None:
        for _ in range(args.batches):
            full_graph._to_torch(outputs[0])

    work: dict[str, Callable[[], Any]] = {
        "read": lambda: [sample_of(reader.read(r)) for r in rows],
        "header check": lambda: [read_header(d) for d in data],
        "parameter draws": lambda: draws(full),
        "decode, whole image": decode(_decoder(args.batch_size, window=False), False),
        "decode, crop window": decode(_decoder(args.batch_size, window=True), True),
        "+ resize to 224x224, float32 NCHW": through(crop_graph, drawn),
        "+ flip, normalize": through(full_graph, full_drawn),
        "hand-off to torch": hand_off,
    }
    out = {}
    for name, fn in work.items():
        out[name] = _median_us(fn, n if name != "hand-off to torch" else args.batch_size * args.batches,
                               args.repeats)
        bar.update()
    return out


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    from tqdm import tqdm

    from stallfree.bench.loader import measure_runs, write_synthetic

    if min(args.batch_size, args.batches, args.repeats, args.threads) < 1:
        raise ValueError("--batch-size, --batches, --repeats and --threads must all be >= 1")
    write_synthetic(args.data, args.synthetic)
    with tqdm(total=8, desc="breakdown", unit="stage", file=sys.stderr, leave=False,
              disable=not getattr(args, "progress", True)) as bar:
        us = _stages(args, bar)
    loader_runs = measure_runs([("stallfree", "stallfree", args.data)], argparse.Namespace(**vars(args), device="cpu"))
    rate = statistics.median(loader_runs["stallfree"])
    loader_us = {
        "read": us["read"],
        "header check": us["header check"],
        "parameter draws": us["parameter draws"],
        "decode (crop window)": us["decode, crop window"],
        "resize, written as float32 NCHW": us["+ resize to 224x224, float32 NCHW"] - us["decode, crop window"],
        "flip, normalize": us["+ flip, normalize"] - us["+ resize to 224x224, float32 NCHW"],
        "hand-off to torch": us["hand-off to torch"],
    }
    total = sum(loader_us.values())
    ideal = args.threads * 1e6 / total
    print(f"{args.data}: batch {args.batch_size}, median of {args.repeats} x {args.batches} batches; one thread "
          "per stage", file=out)
    print("| stage | us per image (1 core) | share |", file=out)
    print("| --- | ---: | ---: |", file=out)
    for name, value in loader_us.items():
        print(f"| {name} | {value:,.0f} | {value / total:.0%} |", file=out)
    print(f"| **the Loader's stages, summed** | **{total:,.0f}** | 100% |", file=out)
    print(f"| (reference) decode, whole image | {us['decode, whole image']:,.0f} | |", file=out)
    print(f"the stages on {args.threads} core(s), perfectly overlapped: {ideal:,.0f} img/s; the Loader measured "
          f"{rate:,.0f} img/s ({rate / ideal:.0%} of that); decoding whole images alone: "
          f"{args.threads * 1e6 / us['decode, whole image']:,.0f} img/s", file=out)
    return {"batch_size": args.batch_size, "batches": args.batches, "repeats": args.repeats, "threads": args.threads,
            "stages_us": us, "loader_us": loader_us, "sum_us": total, "ideal_img_per_s": ideal,
            "loader_img_per_s": rate}
