"""Images per second of the CPU graph's resize: the Numba resampler beside DALI's fn.resize and PIL, same crops.

The crops are what a training graph resizes: RandomResizedCrop(224) windows of the JPEGs in DATA, decoded once
with PIL before timing. Each contender resizes every crop to 224 x 224 (bilinear with antialiasing) using
``--threads`` threads: the two DALI contenders as a CPU pipeline fed by ``external_source``, PIL through a thread
pool (``Image.resize`` releases the GIL). After a warm-up batch (Numba compiles there), ``--repeats`` timed passes
of ``--batches`` batches, the contenders in turns (none of them works ahead, so taking turns is fair, and a shared
machine's slow spell then falls on all of them); the table shows the median, the ratio to DALI's resize, and the
largest difference from PIL's output (torchvision resizes PIL images with PIL) over the first batch.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # numpy is imported where it is used: building the CLI's parser imports this module
    import numpy as np

__all__ = ["add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench resize ./bench-data --synthetic 1000
  stallfree bench resize ./imagenet-subset/train --batches 10 --repeats 5 --json-file resize.json
"""

OUT = (224, 224)
Batch = list["np.ndarray"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("data", type=Path, help="an ImageFolder tree of JPEGs")
    parser.add_argument("--synthetic", type=int, metavar="N", default=0,
                        help="first write N synthetic ImageNet-sized JPEGs into DATA if it is empty")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch")
    parser.add_argument("--batches", type=int, default=8, help="batches per timed pass (distinct crops each)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per contender (the median is shown)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads for every contender (default: the cores this process may use)")


def _crops(data: Path, count: int) -> Batch:
    import numpy as np
    from PIL import Image

    from stallfree.pipeline.readers import FolderReader
    from stallfree.transforms import RandomResizedCrop
    from stallfree.transforms.random import SampleRandom

    reader = FolderReader(data)
    rrc, crops = RandomResizedCrop(OUT), []
    for i in range(count):
        with Image.open(io.BytesIO(reader.read_image(i % len(reader)).tobytes())) as img:
            pixels = np.asarray(img.convert("RGB"))
        top, left, h, w = rrc.window(SampleRandom(0, 0, i), *pixels.shape[:2])
        crops.append(np.ascontiguousarray(pixels[top : top + h, left : left + w]))
    return crops


def _dali(batch_size: int, threads: int, resampler: bool) -> Callable[[Batch], Batch]:
    import numpy as np
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    from stallfree.transforms.kernels.resample_node import resize_node
    from stallfree.transforms.spec import size_input

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, exec_dynamic=True,
                  prefetch_queue_depth=1)
    def pipeline() -> Any:
        image = fn.external_source(name="image", dtype=types.UINT8, layout="HWC")
        if resampler:
            return resize_node(image, fn.external_source(name="size", dtype=types.UINT8))
        return fn.resize(image, size=list(OUT), interp_type=types.INTERP_LINEAR, antialias=True)

    pipe = pipeline()
    pipe.build()
    size = size_input(OUT)

    def run_batch(crops: Batch) -> Batch:
        pipe.feed_input("image", crops)
        if resampler:
            pipe.feed_input("size", [size] * len(crops))
        (out,) = pipe.run()
        return [np.asarray(out[i]) for i in range(len(crops))]

    return run_batch


def _pil(threads: int) -> Callable[[Batch], Batch]:
    import numpy as np
    from PIL import Image

    pool = ThreadPoolExecutor(threads)

    def one(crop: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(crop).resize(OUT[::-1], Image.Resampling.BILINEAR))

    return lambda crops: list(pool.map(one, crops))


def _pass(run_batch: Callable[[Batch], Batch], batches: list[Batch], bar: Any) -> float:
    """One timed pass over ``batches``: images per second."""
    start = time.perf_counter()
    for batch in batches:
        run_batch(batch)
        bar.update()
    return sum(len(b) for b in batches) / (time.perf_counter() - start)


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    import numpy as np
    from tqdm import tqdm

    from stallfree.bench.loader import write_synthetic

    if min(args.batch_size, args.batches, args.repeats, args.threads) < 1:
        raise ValueError("--batch-size, --batches, --repeats and --threads must all be >= 1")
    write_synthetic(args.data, args.synthetic)
    crops = _crops(args.data, args.batch_size * args.batches)
    batches = [crops[i : i + args.batch_size] for i in range(0, len(crops), args.batch_size)]
    contenders = {
        "stallfree resampler (Numba in DALI)": lambda: _dali(args.batch_size, args.threads, resampler=True),
        "DALI fn.resize": lambda: _dali(args.batch_size, args.threads, resampler=False),
        "PIL Image.resize": lambda: _pil(args.threads),
    }
    reference = _pil(args.threads)(batches[0])
    with tqdm(total=len(contenders) * args.repeats * args.batches, desc="resize", unit="batch", file=sys.stderr,
              mininterval=1.0, leave=False, disable=not getattr(args, "progress", True)) as bar:
        runners = {name: make() for name, make in contenders.items()}
        worst = {}
        for name, run_batch in runners.items():  # the warm-up (Numba compiles there), checked against PIL
            first = run_batch(batches[0])
            worst[name] = max(int(np.abs(a.astype(np.int16) - b).max()) for a, b in zip(first, reference, strict=True))
        rates: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.repeats):  # in turns: a shared machine's slow spell falls on every contender alike
            for name, run_batch in runners.items():
                rates[name].append(_pass(run_batch, batches, bar))
        rows: list[dict[str, Any]] = [{"resize": name, "img_per_s": statistics.median(rates[name]), "runs": rates[name],
                 "max_diff": worst[name]} for name in runners]
    mean_px = statistics.fmean(c.shape[0] * c.shape[1] for c in crops)
    print(f"{len(crops)} RandomResizedCrop windows of {args.data} (mean {mean_px:,.0f} px) to 224x224, "
          f"{args.threads} threads, median of {args.repeats} x {args.batches} batches of {args.batch_size}", file=out)
    dali = next(r["img_per_s"] for r in rows if r["resize"] == "DALI fn.resize")
    print("| resize | img/s (median) | vs DALI fn.resize | max difference from PIL |", file=out)
    print("| --- | ---: | ---: | ---: |", file=out)
    for row in rows:
        print(f"| {row['resize']} | {row['img_per_s']:,.0f} | {row['img_per_s'] / dali:.2f}x | {row['max_diff']} |",
              file=out)
    return {"threads": args.threads, "batch_size": args.batch_size, "batches": args.batches, "repeats": args.repeats,
            "rows": rows}
