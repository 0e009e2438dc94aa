"""Images per second of each bundled Numba kernel inside the DALI CPU graph beside the same operation in torch.

Every contender gets the same batches of random uint8 HWC images and the same per-sample parameters (drawn by
the step's own ``draw`` from the sample-keyed generator, host time included for both). The DALI side is an
``external_source`` feeding the step's ``numba_function`` node, run with ``--threads`` DALI threads; the torch
side applies the operation sample by sample to CPU tensors, written as torchvision's tensor functional code
writes it, with ``torch.set_num_threads(--threads)``. Each runs a warm-up batch (Numba compilation is not timed),
then ``--repeats`` timed passes of ``--batches`` batches; the table shows the median and the ratio to torch.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # numpy is imported where it is used: building the CLI's parser imports this module
    import numpy as np

__all__ = ["add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench transforms
  stallfree bench transforms --size 224 --batch-size 64 --batches 10 --json-file transforms.json
  stallfree bench transforms --only ColorJitter RandomErasing
"""


def _steps() -> dict[str, Any]:
    from stallfree.transforms import (
        ColorJitter,
        Cutout,
        GaussianNoise,
        RandomErasing,
        RandomGrayscale,
        RandomPosterize,
        RandomSolarize,
    )

    return {
        "RandomErasing": RandomErasing(p=1.0),
        "Cutout": Cutout(n_holes=1, length=64),
        "GaussianNoise": GaussianNoise(sigma=0.1),
        "RandomSolarize": RandomSolarize(threshold=128, p=1.0),
        "RandomPosterize": RandomPosterize(bits=4, p=1.0),
        "RandomGrayscale": RandomGrayscale(p=1.0),
        "ColorJitter": ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
    }


NAMES = ("RandomErasing", "Cutout", "GaussianNoise", "RandomSolarize", "RandomPosterize", "RandomGrayscale",
         "ColorJitter")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--size", type=int, default=224, help="images are SIZE x SIZE x 3 uint8")
    parser.add_argument("--batch-size", type=int, default=32, help="images per batch")
    parser.add_argument("--batches", type=int, default=8, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per contender (the median is shown)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="DALI threads and torch intra-op threads (default: the cores this process may use)")
    parser.add_argument("--only", nargs="+", choices=NAMES, help="run only these kernels")


# --- torch versions, torchvision's tensor formulas, CHW uint8 -------------------------------------------------


def _torch_ops() -> dict[str, Callable[[Any, dict[str, np.ndarray]], Any]]:
    import torch

    def erase(img: Any, p: dict[str, np.ndarray]) -> Any:
        top, left, h, w = (int(v) for v in p["rect"])
        out = img.clone()
        out[..., top : top + h, left : left + w] = torch.tensor(p["value"], dtype=torch.float32)[:, None, None]
        return out

    def cutout(img: Any, p: dict[str, np.ndarray]) -> Any:
        out = img.clone()
        for y1, y2, x1, x2 in p["holes"].reshape(-1, 4):
            out[..., y1:y2, x1:x2] = 0
        return out

    def noise(img: Any, p: dict[str, np.ndarray]) -> Any:
        mean, sigma = float(p["config"][0]), float(p["config"][1])
        x = img.float() / 255 + mean + sigma * torch.randn(img.shape)
        return (x.clamp_(0, 1) * 255.999).to(torch.uint8)

    def solarize(img: Any, p: dict[str, np.ndarray]) -> Any:
        return torch.where(img >= float(p["threshold"][0]), 255 - img, img) if p["apply"][0] else img

    def posterize(img: Any, p: dict[str, np.ndarray]) -> Any:
        return img & int(p["mask"][0]) if p["apply"][0] else img

    def gray(img: Any) -> Any:
        return (0.2989 * img[0] + 0.587 * img[1] + 0.114 * img[2]).to(img.dtype).unsqueeze(0)

    def grayscale(img: Any, p: dict[str, np.ndarray]) -> Any:
        return gray(img).expand(3, -1, -1).contiguous() if p["apply"][0] else img

    def blend(a: Any, b: Any, f: float) -> Any:
        return (f * a + (1.0 - f) * b).clamp(0, 255).to(a.dtype)

    def hue(img: Any, f: float) -> Any:
        x = img.float() / 255
        r, g, b = x.unbind(0)
        maxc, minc = x.max(0).values, x.min(0).values
        eqc = maxc == minc
        cr = maxc - minc
        ones = torch.ones_like(maxc)
        s = cr / torch.where(eqc, ones, maxc)
        div = torch.where(eqc, ones, cr)
        rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
        h = (maxc == r) * (bc - gc) + ((maxc == g) & (maxc != r)) * (2.0 + rc - bc)
        h = h + ((maxc != g) & (maxc != r)) * (4.0 + gc - rc)
        h = (torch.fmod(h / 6.0 + 1.0, 1.0) + f) % 1.0
        i = torch.floor(h * 6.0)
        fr = h * 6.0 - i
        i = i.to(torch.int32) % 6
        v = maxc
        p_ = (v * (1.0 - s)).clamp(0, 1)
        q = (v * (1.0 - s * fr)).clamp(0, 1)
        t = (v * (1.0 - s * (1.0 - fr))).clamp(0, 1)
        mask = i.unsqueeze(0) == torch.arange(6).view(-1, 1, 1)
        a = torch.stack((torch.stack((v, q, p_, p_, t, v)), torch.stack((t, v, v, q, p_, p_)),
                         torch.stack((p_, p_, t, v, v, q))))
        rgb = torch.einsum("ijk, xijk -> xjk", mask.to(x.dtype), a)
        return (rgb * 255.999).to(torch.uint8)

    def jitter(img: Any, p: dict[str, np.ndarray]) -> Any:
        for op in p["order"]:
            f = float(p["factors"][op]) if op >= 0 else 0.0
            if op == 0:
                img = blend(img, torch.zeros_like(img), f)
            elif op == 1:
                img = blend(img, gray(img).float().mean(), f)
            elif op == 2:
                img = blend(img, gray(img), f)
            elif op == 3:
                img = hue(img, f)
        return img

    return {"RandomErasing": erase, "Cutout": cutout, "GaussianNoise": noise, "RandomSolarize": solarize,
            "RandomPosterize": posterize, "RandomGrayscale": grayscale, "ColorJitter": jitter}


# --- the two contenders -----------------------------------------------------------------------------------------


def _dali_runner(step: Any, batch_size: int, threads: int) -> Callable[[list[np.ndarray], dict], None]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as dali_types
    from nvidia.dali import pipeline_def

    from stallfree.transforms.dali_types import dali_type
    from stallfree.transforms.spec import GraphState

    types: Any = dali_types

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, exec_dynamic=True,
                  prefetch_queue_depth=1)
    def pipe() -> Any:
        image = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        params = {n: fn.external_source(name=n, dtype=dali_type(k)) for n, k in step.params.items()}
        out, _ = step.build(image, params, GraphState("cpu"))
        return out

    p = pipe()
    p.build()

    def run_batch(images: list[np.ndarray], params: dict[str, list[np.ndarray]]) -> None:
        p.feed_input("images", images)
        for name, values in params.items():
            p.feed_input(name, values)
        p.run()

    return run_batch


def _torch_runner(op: Callable[[Any, dict[str, np.ndarray]], Any]) -> Callable[[list[np.ndarray], dict], None]:
    import torch

    def run_batch(images: list[np.ndarray], params: dict[str, list[np.ndarray]]) -> None:
        for i, image in enumerate(images):
            op(torch.from_numpy(image).permute(2, 0, 1), {n: v[i] for n, v in params.items()})

    return run_batch


def _draw(step: Any, batch: int, batch_size: int, size: int) -> dict[str, list[np.ndarray]]:
    from stallfree.transforms.random import batch_random

    randoms = batch_random(0, 0, range(batch * batch_size, (batch + 1) * batch_size))
    drawn = [step.draw(rng, (size, size))[0] for rng in randoms]
    return {name: [d[name] for d in drawn] for name in step.params}


def _time(run_batch: Callable[[list[np.ndarray], dict], None], step: Any, images: list[np.ndarray],
          args: argparse.Namespace, bar: Any) -> float:
    run_batch(images, _draw(step, 0, args.batch_size, args.size))  # warm-up: Numba compiles here
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for b in range(args.batches):
            run_batch(images, _draw(step, b + 1, args.batch_size, args.size))
            bar.update(1)
        rates.append(args.batches * args.batch_size / (time.perf_counter() - start))
    return statistics.median(rates)


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    import numpy as np
    import torch
    from tqdm import tqdm

    if min(args.size, args.batch_size, args.batches, args.repeats, args.threads) < 1:
        raise ValueError("--size, --batch-size, --batches, --repeats and --threads must all be >= 1")
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8) for _ in range(args.batch_size)]
    names = [n for n in NAMES if not args.only or n in args.only]
    steps, ops = _steps(), _torch_ops()
    rows: list[dict[str, Any]] = []
    total = len(names) * 2 * args.repeats * args.batches
    with tqdm(total=total, desc="transforms", unit="batch", file=sys.stderr, mininterval=1.0, leave=False,
              disable=not getattr(args, "progress", True)) as bar:
        for name in names:
            dali = _time(_dali_runner(steps[name], args.batch_size, args.threads), steps[name], images, args, bar)
            ref = _time(_torch_runner(ops[name]), steps[name], images, args, bar)
            rows.append({"kernel": name, "stallfree_dali_cpu": dali, "torch_cpu": ref, "ratio": dali / ref})
    print(f"{args.batch_size} x {args.size}x{args.size}x3 uint8 per batch, {args.threads} threads, median of "
          f"{args.repeats} x {args.batches} batches, images/s", file=out)
    print("| kernel | stallfree (Numba in DALI CPU graph) | torch (CPU tensors) | ratio |", file=out)
    print("| --- | ---: | ---: | ---: |", file=out)
    for row in rows:
        print(f"| {row['kernel']} | {row['stallfree_dali_cpu']:,.0f} | {row['torch_cpu']:,.0f} | "
              f"{row['ratio']:.2f}x |", file=out)
    geo = math.exp(statistics.fmean(math.log(float(r["ratio"])) for r in rows)) if rows else float("nan")
    print(f"geometric mean ratio: {geo:.2f}x", file=out)
    return {"size": args.size, "batch_size": args.batch_size, "threads": args.threads, "batches": args.batches,
            "repeats": args.repeats, "rows": rows, "geometric_mean_ratio": geo}
