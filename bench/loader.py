"""Images per second of stallfree's Loader beside torch's DataLoader and a plain DALI pipeline, same data, one run.

All three run the standard ImageNet train augmentation: RandomResizedCrop(224), horizontal flip, normalize,
float32 NCHW, batch 64. torch's DataLoader is the one baseline (:mod:`stallfree.stage_runtime.baseline`): PIL
decode, torchvision's transforms when torchvision is importable (a labelled PIL stand-in when not), with
``num_workers`` = the cores this process may use. The plain DALI pipeline is ``fn.readers.file`` +
``fn.decoders.image`` + ``fn.random_resized_crop`` + ``fn.crop_mirror_normalize``. A decode-only DALI pipeline
gives the ceiling: no loader that decodes whole JPEGs on these cores can beat it.

Each contender runs one warm-up pass (so the page cache is warm for everyone), then ``--repeats`` timed passes of
``--batches`` batches; the table shows the median and its ratio to torch's DataLoader. With ``--rounds R`` the
whole sequence runs R times (each contender built, warmed up and timed again in each round), so that a shared
machine's slow minutes fall on every contender alike instead of on whichever ran then.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, cast

from stallfree.core.cpu import cpu_seconds

__all__ = ["add_arguments", "contender_stream", "image_files", "run"]

EXAMPLES = """examples:
  stallfree bench loader ./bench-data --synthetic 2000     # make 2,000 ImageNet-sized JPEGs there first
  stallfree bench loader ./bench-data --shards             # and the Loader over Arrow shards of the same files
  stallfree bench loader ~/imagenet/train --batches 50 --repeats 5 --json-file result.json
  stallfree bench loader ./bench-data --rounds 3 --repeats 2   # contenders in turn, 3 times: a shared machine
"""

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("data", type=Path, help="an ImageFolder tree of JPEGs")
    parser.add_argument("--synthetic", type=int, metavar="N", default=0,
                        help="first write N synthetic ImageNet-sized JPEGs (about 0.19 MP) into DATA if it is empty")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch")
    parser.add_argument("--batches", type=int, default=20, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per contender (the median is shown)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every contender in turn this many times, --repeats passes each time: on a shared "
                        "machine whose speed drifts, each contender then meets the same drift")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="threads or workers for every contender (default: the cores this process may use)")
    parser.add_argument("--device", default="cpu",
                        help="cpu, or cuda[:N]: stallfree and DALI decode with nvJPEG and augment on that GPU; "
                        "torch's DataLoader pins its batches and copies them there")
    parser.add_argument("--shards", action="store_true",
                        help="also ingest DATA into Arrow shards, as it is and with --max-side 256, and time the "
                        "Loader over both (torch's DataLoader stays on the original folder)")
    parser.add_argument("--only", nargs="+", choices=CONTENDERS,
                        help="run only these: stallfree, torch (DataLoader), dali (plain pipeline), decode (DALI)")


def image_files(data: Path) -> list[tuple[str, int]]:
    """(path, label) of every image in the folder ``data``, scanned as the Loader's folder reader scans it."""
    from stallfree.pipeline.readers import FolderReader

    reader = FolderReader(data)
    return [(str(p), int(label)) for p, label in zip(reader.paths, reader.labels(), strict=True)]


def _stallfree(args: argparse.Namespace) -> Iterable[Any]:
    from stallfree.pipeline.loader import Loader
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    loader = Loader(args.data, args.batch_size, transform=[RandomResizedCrop(224), RandomHorizontalFlip(),
                    Normalize(MEAN, STD)], shuffle=True, num_threads=args.threads, drop_last=True, device=args.device,
                    echo=getattr(args, "echo", 1))  # bench e2e's echo=2 feed; bench loader has no --echo
    while True:
        yield from loader


def _torch(args: argparse.Namespace) -> Iterable[Any]:
    import torch

    from stallfree.stage_runtime.baseline import EpochKeyed, torch_dataloader

    device = torch.device(args.device)
    loader = torch_dataloader(image_files(args.data), batch_size=args.batch_size, image_size=224, workers=args.threads,
                              persistent=True, pin_memory=device.type == "cuda")
    epoch = 0
    while True:
        cast(EpochKeyed, loader.sampler).inner.set_epoch(epoch)  # the baseline's EpochKeyed over a DistributedSampler
        for images, labels in loader:
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        epoch += 1


def _dali(args: argparse.Namespace, decode_only: bool) -> Iterable[Any]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    import torch
    from nvidia.dali import pipeline_def

    files, labels = zip(*image_files(args.data), strict=True)
    device = torch.device(args.device)
    device_id = None if device.type == "cpu" else (device.index or 0)

    @pipeline_def(batch_size=args.batch_size, num_threads=args.threads, device_id=device_id)
    def pipeline() -> Any:
        jpegs, label = fn.readers.file(files=list(files), labels=list(labels), random_shuffle=True, name="reader")
        images = fn.decoders.image(jpegs, output_type=types.RGB, device="cpu" if device_id is None else "mixed")
        if decode_only:
            return images, label
        images = fn.random_resized_crop(images, size=[224, 224])
        images = fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(), dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])
        return images, label

    pipe = pipeline()
    pipe.build()
    while True:
        yield pipe.run()


CONTENDERS: dict[str, Callable[[argparse.Namespace], Iterable[Any]]] = {
    "stallfree": _stallfree,
    "torch": _torch,
    "dali": lambda args: _dali(args, decode_only=False),
    "decode": lambda args: _dali(args, decode_only=True),
}
LABELS = {"stallfree": "stallfree", "torch": "torch DataLoader", "dali": "plain DALI", "decode": "decode only (DALI)"}


def _measure(name: str, args: argparse.Namespace, cores: list[float] | None = None) -> list[float]:
    """One warm-up pass, then the timed passes back to back; the contender is shut down before the next starts.

    Contenders are timed one after another, never in turns: every loader here prefetches, and one left idle
    while another is timed would fill its queues for free. ``cores`` gets each timed pass's CPU seconds over
    its wall seconds (:func:`cpu_seconds`): how many cores the contender kept busy.
    """
    from tqdm import tqdm

    rates = []
    total = args.batches * (args.repeats + 1)
    with (contender_stream(name, args) as stream,
          tqdm(total=total, desc=LABELS[name], unit="batch", file=sys.stderr, mininterval=1.0, leave=False,
               disable=not getattr(args, "progress", True)) as bar):
        for timed in [False] + [True] * args.repeats:
            start, cpu_start = time.perf_counter(), cpu_seconds()
            for _ in range(args.batches):
                next(stream)
                bar.update()
            if timed:
                wall = time.perf_counter() - start
                rates.append(args.batches * args.batch_size / wall)
                if cores is not None:
                    cores.append((cpu_seconds() - cpu_start) / wall)
    return rates


@contextmanager
def contender_stream(name: str, args: argparse.Namespace) -> Iterator[Iterator[Any]]:
    """An endless stream of ``name``'s batches under ``args`` (data, batch_size, threads, device), shut down on exit.

    The one way ``bench loader`` and ``bench e2e`` build a contender, so both time the same feeds.
    """
    stream = iter(CONTENDERS[name](args))
    try:
        yield stream
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # the generator's own finally blocks stop DataLoader workers and DALI threads


def write_synthetic(data: Path, count: int) -> None:
    """Write ``count`` ImageNet-like JPEGs into ``data`` unless it already holds files.

    They are the generator's ``style="natural"`` images: about 0.19 MP and 73 KiB, with photographs' spectrum.
    """
    if count and not (data.exists() and any(data.iterdir())):
        from stallfree.ingest.synthetic import make_image_folder

        per_class = math.ceil(count / 8)
        print(f"writing {per_class * 8} synthetic JPEGs to {data} ...", file=sys.stderr)
        make_image_folder(data, num_classes=8, per_class=per_class, size=(375, 500), vary_size=True, style="natural")


def bench_files(data: Path, count: int, batch_size: int) -> list[tuple[str, int]]:
    """``data``'s (path, label) pairs, after :func:`write_synthetic` writes ``count`` JPEGs into it if it is empty.

    Raises:
        ValueError: ``data`` holds fewer images than one batch of ``batch_size``.
    """
    write_synthetic(data, count)
    files = image_files(data)
    if len(files) < batch_size:
        raise ValueError(f"{data} has {len(files)} images, fewer than one batch of {batch_size}")
    return files


def shard_runs(args: argparse.Namespace, work: Path) -> list[tuple[str, str, Path]]:
    """Ingest ``args.data`` into shards in ``work``, as it is and with ``--max-side 256``: (label, contender, data)."""
    from stallfree.ingest.runner import ingest
    from stallfree.ingest.writer import IngestOptions

    workers, shown = len(os.sched_getaffinity(0)), getattr(args, "progress", True)
    shards, small = work / "shards", work / "shards-max-side-256"
    ingest(args.data, shards, IngestOptions(shard_mb=64), workers=workers, progress=shown)
    ingest(args.data, small, IngestOptions(shard_mb=64, max_side=256), workers=workers, progress=shown)
    return [("stallfree, shards", "stallfree", shards), ("stallfree, shards --max-side 256", "stallfree", small)]


def measure_runs(
    runs: list[tuple[str, str, Path]], args: argparse.Namespace, cores: dict[str, list[float]] | None = None
) -> dict[str, list[float]]:
    """Time each (label, contender, data) in turn, ``args.rounds`` times over (default once).

    Returns the img/s of every timed pass, by label, in the order they ran (and cores busy, if asked).
    """
    out: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for _ in range(getattr(args, "rounds", 1)):
        for label, name, data in runs:
            busy: list[float] | None = None if cores is None else cores.setdefault(label, [])
            out[label] += _measure(name, argparse.Namespace(**{**vars(args), "data": data}), busy)
    return out


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    write_synthetic(args.data, args.synthetic)
    if args.batches < 1 or args.repeats < 1 or args.batch_size < 1 or args.rounds < 1:
        raise ValueError("--batches, --repeats, --rounds and --batch-size must be positive")
    files = image_files(args.data)
    if len(files) < args.batch_size:
        raise ValueError(f"{args.data} has {len(files)} images, fewer than one batch of {args.batch_size}")
    runs = [(LABELS[name], name, args.data) for name in args.only or list(CONTENDERS)]
    with tempfile.TemporaryDirectory(prefix="stallfree-bench-shards-") as work:
        if getattr(args, "shards", False):
            runs[1:1] = shard_runs(args, Path(work))
        cores: dict[str, list[float]] = {}
        results = measure_runs(runs, args, cores)
    medians = {label: statistics.median(rates) for label, rates in results.items()}
    busy = {label: statistics.median(values) for label, values in cores.items()}
    base = medians.get(LABELS["torch"])
    print(f"{len(files)} images in {args.data}, batch {args.batch_size}, {args.threads} threads, {args.device}, "
          f"median of {args.rounds * args.repeats} x {args.batches} batches"
          + (f" ({args.rounds} rounds of {args.repeats})" if args.rounds > 1 else ""), file=out)
    texts = {label: ", ".join(f"{r:.0f}" for r in rates) for label, rates in results.items()}
    width = max([28, *map(len, texts.values())])
    print(f"| {'loader':<33} | {'img/s (median)':>14} | {'runs':<{width}} | {'vs torch DataLoader':>19} | "
          f"{'cores busy':>10} |", file=out)
    print(f"|{'-' * 35}|{'-' * 15}:|{'-' * (width + 2)}|{'-' * 20}:|{'-' * 11}:|", file=out)
    for label, median in medians.items():
        ratio = f"{median / base:.2f}x" if base else "-"
        print(f"| {label:<33} | {median:>14.0f} | {texts[label]:<{width}} | {ratio:>19} | {busy[label]:>10.2f} |",
              file=out)
    print(f"cores busy: CPU seconds of the process, its threads and workers over wall seconds, median of the passes "
          f"({len(os.sched_getaffinity(0))} cores here)", file=out)
    from stallfree.stage_runtime.baseline import transform_label

    if LABELS["torch"] in results:
        print(f"torch DataLoader: PIL decode, {transform_label()}", file=out)
    return {"images": len(files), "batch_size": args.batch_size, "threads": args.threads, "device": args.device,
            "rounds": args.rounds, "runs": results, "median": medians, "cores_busy": busy,
            "torch_transform": transform_label()}
