"""What the Loader's graph on Ray workers costs and saves: the local Loader beside a Ray-backed one, same data.

Both Loaders read the same folder with the same augmentation (RandomResizedCrop(SIZE), flip, normalize, float32,
batch 64) and the same seed, so they deliver the same batches. For each: a warm-up pass (the Ray actors start and
build their graphs there), then ``--repeats`` timed passes of ``--batches`` batches, the median shown:

* delivered img/s;
* the trainer process's CPU seconds per image (its own user + system time, psutil, without its children: a cluster
  started here by ``ray.init()`` is its child), i.e. what the host that feeds the accelerator spends;
* the workers' CPU seconds per image (each actor's own process, read by the actor);
* bytes that crossed from the workers per image (``transfer``: the Loader's output, or uint8 before Normalize).

On one small machine Ray cannot add cores: the workers share the trainer's. What carries over to a cluster is the
cost: the trainer's CPU per image with and without workers, and the workers' per-core rate, from which the table
projects the throughput of N workers of C cores (``N * C / worker CPU s per image``), capped by what one trainer
core can take in (``1 / trainer CPU s per image``). A projection, not a measurement: network and the actors'
placement are not in it.

Ray: the cluster this process is connected to, else ``--address`` or ``RAY_ADDRESS``, else a local one started here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench ray ./bench-data --synthetic 512 --workers 2
  stallfree bench ray ./imagenet-subset/train --address 10.0.0.5:6379 --workers 16 --cpus-per-worker 4 --json
"""

PROJECTED = (1, 2, 4, 8, 16, 32, 64)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("data", type=Path, help="an ImageFolder tree of JPEGs")
    parser.add_argument("--synthetic", type=int, metavar="N", default=0,
                        help="first write N synthetic ImageNet-sized JPEGs into DATA if it is empty")
    parser.add_argument("--workers", type=int, default=2, help="Ray actors (default 2)")
    parser.add_argument("--cpus-per-worker", type=int, default=1, help="CPUs (and DALI threads) per actor")
    parser.add_argument("--transfer", choices=("output", "uint8"), default="output",
                        help="what crosses from the workers: the float32 output, or uint8 (normalized here)")
    parser.add_argument("--address", default=None, help="the Ray cluster (default: RAY_ADDRESS, else a local one)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch")
    parser.add_argument("--batches", type=int, default=6, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per Loader (the median is shown)")
    parser.add_argument("--size", type=int, default=224, help="the crop's side")
    parser.add_argument("--threads", type=int, default=None, help="the local Loader's DALI threads (default: cores)")


def _own_cpu() -> float:
    """This process's CPU seconds, its children left out (stallfree.core.cpu counts them: here the local cluster)."""
    import psutil

    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def _workers_cpu(workers: Any) -> float:
    import ray

    return float(sum(ray.get([actor.cpu_seconds.remote() for actor in workers.pool().actors])))


def _measure(loader: Any, workers: Any, args: argparse.Namespace, bar: Any) -> dict[str, float]:
    """Median img/s, trainer CPU s/img, worker CPU s/img and bytes/img over the timed passes."""
    rates, trainer, worker, moved = [], [], [], []
    epoch = 0
    loader.set_epoch(epoch)
    for _ in zip(range(args.batches), loader, strict=False):  # warm-up: actors start, graphs build
        pass
    for _ in range(args.repeats):
        epoch += 1
        loader.set_epoch(epoch)
        images_seen, nbytes = 0, 0
        cpu, remote = _own_cpu(), _workers_cpu(workers) if workers is not None else 0.0
        start = time.perf_counter()
        for _, (images, _labels) in zip(range(args.batches), loader, strict=False):
            images_seen += len(images)
            per_value = 1 if workers is not None and workers.transfer == "uint8" else images.element_size()
            nbytes += images.numel() * per_value
            bar.update()
        wall = time.perf_counter() - start
        rates.append(images_seen / wall)
        trainer.append((_own_cpu() - cpu) / images_seen)
        if workers is not None:
            worker.append((_workers_cpu(workers) - remote) / images_seen)
            moved.append(nbytes / images_seen)
    return {"img_per_s": statistics.median(rates), "trainer_cpu_s_per_img": statistics.median(trainer),
            "worker_cpu_s_per_img": statistics.median(worker) if worker else 0.0,
            "bytes_per_img": statistics.median(moved) if moved else 0.0}


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return its results (JSON-able)."""
    from tqdm import tqdm

    from stallfree.bench.loader import write_synthetic
    from stallfree.pipeline.loader import Loader
    from stallfree.pipeline.ray_workers import RayWorkers
    from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

    if min(args.workers, args.cpus_per_worker, args.batch_size, args.batches, args.repeats, args.size) < 1:
        raise ValueError("--workers, --cpus-per-worker, --batch-size, --batches, --repeats and --size must be >= 1")
    write_synthetic(args.data, args.synthetic)
    spec = [RandomResizedCrop(args.size), RandomHorizontalFlip(),
            Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))]
    workers = RayWorkers(num_workers=args.workers, cpus_per_worker=args.cpus_per_worker, address=args.address,
                         transfer=args.transfer)
    options: dict[str, Any] = {"transform": spec, "shuffle": True, "seed": 0, "dtype": "float32", "drop_last": True}
    results: dict[str, Any] = {"workers": args.workers, "cpus_per_worker": args.cpus_per_worker,
                               "transfer": args.transfer, "batch_size": args.batch_size, "size": args.size}
    total = 2 * args.repeats * args.batches
    with tqdm(total=total, desc="ray", unit="batch", file=sys.stderr, mininterval=1.0, leave=False,
              disable=not getattr(args, "progress", True)) as bar:
        with Loader(args.data, args.batch_size, num_threads=args.threads, **options) as local:
            results["local"] = _measure(local, None, args, bar)
        try:
            with Loader(args.data, args.batch_size, workers=workers, **options) as remote:
                results["ray"] = _measure(remote, workers, args, bar)
        finally:
            workers.close()
    results["projected"] = _project(results, args.cpus_per_worker)
    _table(results, out)
    return results


def _project(results: dict[str, Any], cpus: int) -> list[dict[str, float]]:
    """img/s of N workers of ``cpus`` cores from the workers' per-core rate, capped by one trainer core's."""
    ray = results["ray"]
    per_core = 1.0 / ray["worker_cpu_s_per_img"] if ray["worker_cpu_s_per_img"] > 0 else 0.0
    trainer_cap = 1.0 / ray["trainer_cpu_s_per_img"] if ray["trainer_cpu_s_per_img"] > 0 else float("inf")
    return [{"workers": n, "cores": n * cpus, "img_per_s": min(n * cpus * per_core, trainer_cap),
             "trainer_bound": n * cpus * per_core > trainer_cap} for n in PROJECTED]


def _table(results: dict[str, Any], out: TextIO) -> None:
    local, ray = results["local"], results["ray"]
    print(f"{'':34} {'img/s':>8} {'trainer CPU ms/img':>19} {'worker CPU ms/img':>18} {'KB/img moved':>13}",
          file=out)
    print(f"{'local Loader':34} {local['img_per_s']:8.1f} {1e3 * local['trainer_cpu_s_per_img']:19.2f} "
          f"{'-':>18} {'-':>13}", file=out)
    label = f"Ray, {results['workers']} x {results['cpus_per_worker']} CPU ({results['transfer']})"
    print(f"{label:34} {ray['img_per_s']:8.1f} {1e3 * ray['trainer_cpu_s_per_img']:19.2f} "
          f"{1e3 * ray['worker_cpu_s_per_img']:18.2f} {ray['bytes_per_img'] / 1e3:13.1f}", file=out)
    print("\nprojected (workers' per-core rate, capped by one trainer core):", file=out)
    for row in results["projected"]:
        bound = "  (trainer-bound)" if row["trainer_bound"] else ""
        print(f"  {row['workers']:3d} workers, {row['cores']:3d} cores: {row['img_per_s']:9.0f} img/s{bound}",
              file=out)
