"""``stallfree profile DATA``: measure storage, preparation and compute alone, then together; name the stall."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["register"]

EXAMPLES = """examples:
  stallfree profile ./data/train                         # mlp, batch 64, 224 px; writes ./profile-out/
  stallfree profile ./data/train --model resnet18 --batch-size 128 --device cuda --out prof/
  stallfree profile ./data/train --compare torch         # torch's DataLoader beside stallfree's Loader
  stallfree profile files.csv --image-size 64 --batches 10 --threads 2
"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stallfree profile``."""
    parser = sub.add_parser(
        "profile",
        help="find the stage that stalls the training step (DS-Analyzer's differential measurements)",
        description="Measure storage read (cold and warm), decode + augment from memory at 1..N threads, the "
        "model's step on synthetic data (the ideal), then the Loader feeding the model from storage and from "
        "memory. Report the fetch and preparation stalls as shares of step time, the bottleneck, and what would "
        "remove it. Writes profile.json, trace.json (open in https://ui.perfetto.dev) and profile.png.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("data", type=Path, help="an ImageFolder tree or a CSV/Parquet file list")
    parser.add_argument("--model", default="mlp",
                        help="mlp, cnn, small_cnn, resnet_cifar, resnet18, resnet50, vit_small, or package.module:fn")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=224, help="RandomResizedCrop output side (default 224)")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per run (default 20)")
    parser.add_argument("--threads", type=int, default=None,
                        help="the most preparation threads (default: the cores this process may use)")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch's intra-op threads for the model step (default: torch's own choice); on a CPU "
                        "shared with the loader's threads, fewer can be much faster")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    parser.add_argument("--compare", choices=["torch"], help="also run torch's DataLoader (PIL decode) the same way")
    parser.add_argument("--max-side", type=int, default=None,
                        help="the what-if's ingest --max-side (default: image size x 256/224)")
    parser.add_argument("--storage-files", type=int, default=None, help="read at most this many files in phase 1")
    parser.add_argument("--out", type=Path, default=Path("profile-out"), help="output folder (default ./profile-out)")
    parser.add_argument("--json", action="store_true", help="also print profile.json to stdout")
    parser.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    for name in ("batch_size", "image_size", "batches"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("threads", "max_side", "storage_files", "torch_threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def _thread_counts(most: int) -> list[int]:
    counts, k = [], 1
    while k < most:
        counts.append(k)
        k *= 2
    return [*counts, most]


def _forever(make: Any) -> Iterator[Any]:
    while True:
        yield from make()


def run(args: argparse.Namespace) -> int:
    """Run the five phases, print the table, write the three files; returns the exit code."""
    import torch

    _check(args)
    previous_threads = torch.get_num_threads()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(previous_threads)  # the setting is process-wide; leave it as we found it


def _run(args: argparse.Namespace) -> int:
    import psutil
    import torch
    from tqdm import tqdm

    from stallfree import Loader
    from stallfree.commands import CliError
    from stallfree.pipeline.readers import open_source
    from stallfree.stage_runtime import profile_phases as ph
    from stallfree.stage_runtime.clock import StageClock
    from stallfree.stage_runtime.profile import profile
    from stallfree.stage_runtime.profile_chart import draw_profile
    from stallfree.stage_runtime.profile_compare import torch_dataloader
    from stallfree.stage_runtime.profile_report import PROFILE_FORMAT, check_schema, differential_stalls, what_ifs
    from stallfree.stage_runtime.profile_sampler import ResourceSampler
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    cores = len(os.sched_getaffinity(0))
    threads = args.threads or cores
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    reader = open_source(args.data)
    paths = ph.dataset_files(args.data, reader)
    batch = args.batch_size
    needed = batch * 3  # warm-up batches plus one timed
    if len(reader) < needed:
        raise CliError(f"{args.data} has {len(reader)} samples; profiling needs at least {needed} "
                       f"(3 batches of {batch}): lower --batch-size")
    transform = [RandomResizedCrop(args.image_size), RandomHorizontalFlip(), Normalize()]
    clock = StageClock()
    sampler = ResourceSampler(0.1).start()
    origin = time.perf_counter()

    @contextmanager
    def phase(name: str, total: int) -> Iterator[Any]:
        sampler.phase = name
        with tqdm(total=total, desc=name, unit="it", file=sys.stderr, mininterval=0.5, leave=True) as bar:
            yield bar.update

    try:
        storage_paths = paths[: args.storage_files] if args.storage_files else paths
        with phase("1 storage", 2 * len(storage_paths)) as tick:
            storage = ph.measure_storage(storage_paths, threads=4, clock=clock, progress=tick)
        in_memory = ph.InMemoryReader(reader, rows=min(len(reader), batch * (args.batches + 2)))
        counts = _thread_counts(threads)
        prep_batches = max(2, args.batches // 2)
        with phase("2 preparation", prep_batches * len(counts)) as tick:
            def make(k: int) -> Iterator[Any]:
                return _forever(lambda: Loader(in_memory, batch, transform=transform, num_threads=k,
                                               drop_last=True))
            prep = ph.measure_preparation(make, counts, prep_batches, batch, progress=tick)
        model = ph.build_model(args.model, len(reader.classes), args.image_size)
        with phase("3 compute", args.batches) as tick:
            compute = ph.measure_compute(args.model, model, device, batch, args.image_size, len(reader.classes),
                                         args.batches, clock=clock, progress=tick)
        step = ph.make_train_step(model, device)

        def timed_run(name: str, loader: Any) -> Any:
            runs = min(args.batches, len(loader) - 2)
            with phase(name, runs) as tick:
                return profile(loader, step, batches=runs, warmup=2, clock=clock, progress=tick)

        cold_note = ph.drop_page_cache(paths).note
        real = timed_run("4 real run", Loader(args.data, batch, transform=transform, num_threads=threads,
                                              device=device, drop_last=True))
        cached = timed_run("5 real run, from memory", Loader(in_memory, batch, transform=transform,
                                                             num_threads=threads, device=device, drop_last=True))
        compare = {}
        if args.compare == "torch":
            ph.drop_page_cache(paths)
            labels = [int(x) for x in reader.labels()]
            loader = torch_dataloader(paths, labels, batch_size=batch, image_size=args.image_size, workers=threads)
            compare["torch"] = timed_run("6 torch DataLoader", loader).to_dict()
    finally:
        sampler.stop()

    stalls = differential_stalls(compute.step_s, cached.wall_s / cached.batches, real.wall_s / real.batches,
                                 real.stall_share, real.verdict, fallback=real.bottleneck,
                                 fallback_shares=(real.fetch_stall_share, real.prep_stall_share))
    memory = psutil.virtual_memory()
    max_side = args.max_side or round(args.image_size * 256 / 224)
    fetch_step_s = batch * (storage.bytes / storage.files) / storage.cold_bytes_per_s
    result: dict[str, Any] = {
        "format": PROFILE_FORMAT, "data": str(args.data), "images": len(reader), "model": args.model,
        "device": str(device), "batch_size": batch, "image_size": args.image_size, "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "phases": {
            "storage": {**vars(storage), "cold_images_per_s": storage.cold_files_per_s,
                        "warm_images_per_s": storage.warm_files_per_s},
            "preparation": {"points": [vars(p) for p in prep], "in_memory_images": len(in_memory),
                            "in_memory_bytes": in_memory.nbytes},
            "compute": vars(compute),
            "real_run": {**real.to_dict(), "cold": cold_note is None, "cold_note": cold_note},
            "cached_run": cached.to_dict(),
        },
        "stalls": vars(stalls),
        "what_if": what_ifs(batch_size=batch, cores=cores, ideal_step_s=compute.step_s,
                            prep_points=[(p.threads, p.images_per_s) for p in prep], fetch_step_s=fetch_step_s,
                            dataset_bytes=sum(p.stat().st_size for p in paths), available_bytes=memory.available,
                            total_bytes=memory.total, paths=paths, max_side=max_side),
        "resources": sampler.to_dicts(origin),
        "clock": {"spans": len(clock), "dropped": clock.dropped},
    }
    if compare:
        result["compare"] = compare
    check_schema(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile.json").write_text(json.dumps(result, indent=2))
    clock.to_chrome_trace(args.out / "trace.json")
    draw_profile(result, args.out / "profile.png")
    print(_table(result))
    print(f"wrote {args.out / 'profile.json'}, {args.out / 'trace.json'} (https://ui.perfetto.dev), "
          f"{args.out / 'profile.png'}")
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


def _table(r: dict[str, Any]) -> str:
    from stallfree.stage_runtime.profile_report import headline

    p, s, w = r["phases"], r["stalls"], r["what_if"]
    batch = r["batch_size"]
    rows = [("1 storage, cold", p["storage"]["cold_images_per_s"],
             f"{p['storage']['cold_bytes_per_s'] / 2**20:.0f} MiB/s"
             + ("" if p["storage"]["cold_note"] is None else f" ({p['storage']['cold_note']})")),
            ("1 storage, warm", p["storage"]["warm_images_per_s"],
             f"{p['storage']['warm_bytes_per_s'] / 2**20:.0f} MiB/s")]
    rows += [(f"2 prepare, {q['threads']} thread(s)", q["images_per_s"], "decode + augment from memory")
             for q in p["preparation"]["points"]]
    rows += [("3 compute (ideal)", p["compute"]["images_per_s"],
              f"{r['model']} on {r['device']}, synthetic, {r['torch_threads']} torch thread(s)")]
    rows += [("4 real run", p["real_run"]["samples_per_s"], f"stall {p['real_run']['stall_share']:.0%} "
              f"({p['real_run']['verdict']})"),
             ("5 real run, from memory", p["cached_run"]["samples_per_s"],
              f"stall {p['cached_run']['stall_share']:.0%}")]
    for name, run in r.get("compare", {}).items():
        rows.append((f"6 {name} DataLoader", run["samples_per_s"], f"stall {run['stall_share']:.0%} "
                     f"({run['verdict']})"))
    lines = [f"| {'phase':<26} | {'img/s':>8} | {'ms/batch':>8} | note", f"|{'-' * 28}|{'-' * 9}:|{'-' * 9}:|------"]
    lines += [f"| {name:<26} | {rate:>8.0f} | {1e3 * batch / rate if rate else 0:>8.1f} | {note}"
              for name, rate, note in rows]
    lines.append("")
    lines.append(f"{headline(s)}. Step time {s['real_step_s'] * 1e3:.1f} ms (ideal {s['ideal_step_s'] * 1e3:.1f} "
                 f"ms, from memory {s['cached_step_s'] * 1e3:.1f} ms).")
    lines += [f"note: {n}" for n in s["notes"]]
    c, pc, e = w["cores"], w["page_cache"], w["echo"]
    lines.append(f"what if: {c['needed_to_remove_prep_stall']} core(s) would remove the preparation stall "
                 f"(this process has {c['have']}; {c['how']}).")
    if pc["fits"]:
        lines.append(f"what if: the dataset ({pc['dataset_bytes'] / 2**30:.2f} GiB) fits the page cache "
                     f"({pc['available_bytes'] / 2**30:.1f} GiB available): epochs after the first read warm.")
    else:
        lines.append(f"what if: the dataset ({pc['dataset_bytes'] / 2**30:.2f} GiB) does not fit the page cache; "
                     f"{pc['more_memory_needed_bytes'] / 2**30:.1f} GiB more memory would make it.")
    m = w["max_side"]
    if "speedup" in m:
        lines.append(f"what if: ingest --max-side {m['max_side']} keeps {m['pixel_ratio']:.0%} of the pixels: "
                     f"predicted {m['speedup']:.2f}x the step rate ({m['assumes']}).")
    if e["k_to_remove_input_stall"] == 1:
        lines.append("what if: echo=k would not help: the input stages already outpace the step.")
    else:
        steps = ", ".join(f"k={k}: {1e3 * t:.1f} ms" for k, t in e["predicted_step_s"].items())
        lines.append(f"what if: echo=k, {e['mode']}: predicted step {steps}; k={e['k_to_remove_input_stall']} "
                     "removes the input stall.")
    return "\n".join(lines)
