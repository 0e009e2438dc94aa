"""``stallfree plan``: simulate every schedule for a model and a set of devices; rank them; draw the best."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["register"]


EXAMPLES = """examples:
  stallfree plan --model small_cnn --devices 4                      # measured here, 25GB/s,5us links
  stallfree plan --model resnet50 --image-size 224 --batch-size 64 --devices 8 --memory-per-device 16GiB
  stallfree plan --model mlp --devices 8 --sites 2 --link 25GB/s,5us --cross-link 1GB/s,20ms
  stallfree plan --costs my_layers.json --devices 4 --json | jq .best    # costs of hardware you do not have
  stallfree bench plan --stages 2 --json-file bench-plan.json              # measure the host overhead and link
  stallfree plan --model mlp --image-size 16 --devices 2 --device cpu --calibration bench-plan.json
  stallfree plan --model mlp --image-size 16 --devices 4 --device cpu --cores 2   # 4 stage processes, 2 cores
  stallfree train --synthetic 512 --model mlp --image-size 16 --schedule gpipe --microbatches 2 --max-steps 8 --out p/g2
  stallfree plan --model mlp --image-size 16 --devices 2 --device cpu --calibration bench-plan.json --pilots p/*
"""


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants integers like 2,4,8, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"wants integers >= 1, got {text!r}")
    return values


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stallfree plan``."""
    from stallfree.stage_runtime.plan.planner import SYNC_SCHEDULES

    p = sub.add_parser(
        "plan",
        help="predict step time, bubble and memory of every pipeline schedule, and pick one",
        description="Measure the model's layers (the partitioner's measurement, as stallfree train does) or read "
        "them from --costs, then simulate one training step for every schedule, pipeline rank count, virtual "
        "stage count, micro-batch count and split, over the links you describe. Prints the fastest that fit in "
        "--memory-per-device with their bubble split into warm-up/cool-down, imbalance and communication, and "
        "the asynchronous schedules PipeDream-2BW and async 1F1B beside them (simulated only). Writes plan.json "
        "and timeline.png (the best plan's step) under --out.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="small_cnn",
                   help="a bundled model (as stallfree train --model) or package.module:factory (default small_cnn)")
    p.add_argument("--costs", type=Path, help="per-layer costs from a JSON file instead of measuring (docs/plan.md)")
    p.add_argument("--image-size", type=int, default=32, help="side of the square images the model takes")
    p.add_argument("--classes", type=int, default=10, help="classes the model predicts")
    p.add_argument("--batch-size", type=int, default=32, help="images per step, split into micro-batches")
    p.add_argument("--devices", type=int, default=2, help="devices available; 2..N pipeline ranks are tried")
    p.add_argument("--sites", type=int, default=None,
                   help="the devices form this many equal sites joined by --cross-link (default 1; 2 with "
                   "--cross-link)")
    p.add_argument("--link", default=None,
                   help="bandwidth,latency between devices of a site (default 25GB/s,5us, or --calibration's)")
    p.add_argument("--calibration", type=Path, default=None,
                   help="a calibration JSON (what stallfree bench plan --json-file writes): rank with its measured "
                   "link and the host overhead of torch's schedule runtime per action kind, send, message and "
                   "step, for gloo on the CPU it was measured on (default: free runtime, --link)")
    p.add_argument("--pilots", type=Path, nargs="+", default=None, metavar="RUN_DIR",
                   help="--out folders of finished stallfree train jobs of this --model on this machine (say each "
                   "schedule at a few and many --microbatches): their spans and steps fit the host overhead for the "
                   "pipeline ranks they ran, per schedule, else per family; other rank counts keep --calibration's "
                   "(docs/plan.md, \"Pilots\")")
    p.add_argument("--cross-link", default=None, help="bandwidth,latency between sites, e.g. 1GB/s,20ms")
    p.add_argument("--memory-per-device", default=None, help="e.g. 16GiB; plans that need more rank last")
    p.add_argument("--schedules", type=lambda t: t.split(","), default=list(SYNC_SCHEDULES),
                   help=f"comma-separated, from {','.join(SYNC_SCHEDULES)} (default all)")
    p.add_argument("--microbatches", type=_ints, default=[1, 2, 4, 8, 16, 32],
                   help="micro-batch counts to try (those dividing --batch-size; default 1,2,4,8,16,32)")
    p.add_argument("--virtual-stages", type=_ints, default=[2, 4],
                   help="stages per rank to try for interleaved-1f1b and zero-bubble (default 2,4)")
    p.add_argument("--device", default=None, help="where to measure: cpu or cuda[:N] (default cuda when available)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads while measuring on CPU (default: cores / devices, as stallfree train gives "
                   "each stage process)")
    p.add_argument("--cores", type=int, default=None,
                   help="the pipeline's ranks are processes sharing N CPU cores of one machine (as stallfree train "
                   "runs them on a CPU): compute is stretched while more ranks compute at once than the cores hold, "
                   "each rank computing on --threads threads (default cores / devices, at least 1), e.g. --cores 2 "
                   "--devices 4 (default: each rank has a device of its own)")
    p.add_argument("--top", type=int, default=5, help="how many plans to print (default 5)")
    p.add_argument("--no-async", dest="asynchronous", action="store_false",
                   help="leave out the asynchronous schedules")
    p.add_argument("--out", type=Path, default=Path("stallfree-plan"), help="output folder (default ./stallfree-plan)")
    p.add_argument("--json", action="store_true", help="print plan.json alone on stdout (the table goes to stderr)")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    from stallfree.stage_runtime.plan.planner import SYNC_SCHEDULES

    for name in ("image_size", "classes", "batch_size", "devices", "top"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.devices < 2:
        raise ValueError(f"--devices must be >= 2 to split a model into a pipeline, got {args.devices}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.cores is not None and args.cores < 1:
        raise ValueError(f"--cores must be >= 1, got {args.cores}; leave it out to give each rank a device")
    unknown = [s for s in args.schedules if s not in SYNC_SCHEDULES]
    if unknown:
        raise ValueError(f"--schedules: unknown {', '.join(unknown)}; choose from {', '.join(SYNC_SCHEDULES)}")
    if not any(args.batch_size % m == 0 for m in args.microbatches):
        raise ValueError(f"--microbatches {','.join(map(str, args.microbatches))}: none divides --batch-size "
                         f"{args.batch_size}")
    if args.costs is not None and not args.costs.is_file():
        raise FileNotFoundError(f"--costs {args.costs}: no such file")
    if args.calibration is not None and not args.calibration.is_file():
        raise FileNotFoundError(f"--calibration {args.calibration}: no such file")
    for folder in args.pilots or ():
        if not folder.is_dir():
            raise FileNotFoundError(f"--pilots {folder}: no such folder")


def _layer_source(args: argparse.Namespace) -> tuple[Any, float, dict[str, Any]]:
    """(micro-batch size -> layer costs, optimizer seconds, how they were obtained)."""
    from stallfree.stage_runtime.plan.costs import layers_from_json, scale_layers

    if args.costs is not None:
        layers, micro, optimizer_s = layers_from_json(args.costs)
        return (lambda b: scale_layers(layers, b / micro)), optimizer_s, {"source": str(args.costs),
                                                                          "microbatch": micro}
    import torch

    from stallfree.stage_runtime.plan.measure import measure_model
    from stallfree.stage_runtime.train.models import build_model

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args.model, args.classes, args.image_size)
    optimizer = []

    @cache
    def layers_for(micro: int) -> Any:
        print(f"measuring {args.model}'s {len(model)} layers on {device} at micro-batch {micro}", file=sys.stderr)
        layers, opt = measure_model(model, args.image_size, micro, device)
        optimizer.append(opt)
        return layers

    layers_for(args.batch_size)
    return layers_for, optimizer[0], {"source": "measured", "device": device, "threads": torch.get_num_threads()}


def _calibration(args: argparse.Namespace) -> tuple[dict[str, Any], Any, Any]:
    """(what was used, for plan.json; (schedule, ranks) -> host overhead; the calibrated link or None)."""
    from stallfree.stage_runtime.plan.calibrate import read_calibration
    from stallfree.stage_runtime.plan.costs import NO_OVERHEAD

    if args.calibration is None:
        return {}, lambda schedule, ranks: NO_OVERHEAD, None
    found = read_calibration(args.calibration)
    used: dict[int, int] = {}

    def nearest(ranks: int) -> int:
        return min(found, key=lambda r: (abs(r - ranks), -r))  # the same rank count, else the nearest

    def overhead_for(schedule: str, ranks: int) -> Any:
        used[ranks] = nearest(ranks)
        return found[used[ranks]].overhead(schedule)

    link = found[min(found)].link  # two processes' ping-pong: the least contended
    describe = (f"{args.calibration} (measured on {', '.join(map(str, sorted(found)))} processes; a plan of S ranks "
                f"takes the nearest; link {link.describe()})")
    return {"file": str(args.calibration), "describe": describe, "ranks": sorted(found), "used": used,
            "calibrations": {str(r): c.to_dict() for r, c in found.items()}}, overhead_for, link


_PILOT_SOURCES = {"schedule": "from its pilots", "family": "from its family's", "none": "without"}


def _pilots(args: argparse.Namespace, link: Any, cores: Any, fallback: Any) -> tuple[dict[str, Any], Any]:
    """(what was used, for plan.json; (schedule, ranks) -> host overhead): ``--pilots``' fit, else ``fallback``'s."""
    from stallfree.stage_runtime.plan.pilots import fit_pilots, read_pilot

    if not args.pilots:
        return {}, fallback
    pilots = [read_pilot(folder) for folder in args.pilots]
    models = sorted({p.model for p in pilots})
    if args.costs is None and models != [args.model]:
        raise ValueError(f"--pilots ran {', '.join(models)}, not --model {args.model}: pilots fit the overhead of "
                         "the model they ran")
    by_ranks: dict[int, list[Any]] = {}
    for p in pilots:
        by_ranks.setdefault(p.stages, []).append(p)
    fits = {ranks: fit_pilots(mine, link, cores) for ranks, mine in sorted(by_ranks.items())}

    def overhead_for(schedule: str, ranks: int) -> Any:
        fit = fits.get(ranks)
        found = fit.overhead(schedule) if fit is not None else None
        if found is not None:
            return found
        return fallback(schedule, ranks)

    runs = ", ".join(f"{p.schedule} S={p.stages} M={p.microbatches}" for p in pilots)
    other = "--calibration's" if args.calibration else "no host overhead"
    sources = "; ".join(
        f"S={r}: " + ", ".join(f"{s} {_PILOT_SOURCES[fit.source(s)]}" for s in args.schedules)
        for r, fit in fits.items())
    describe = (f"host overhead fitted from {len(pilots)} pilot job(s) ({runs}); {sources} ({other} where "
                f"no pilot of the family ran, and for other rank counts)")
    return {"folders": [str(f) for f in args.pilots], "describe": describe,
            "fits": {str(r): f.to_dict() for r, f in fits.items()}}, overhead_for


def run(args: argparse.Namespace) -> int:
    """Measure, simulate, print the table, write plan.json and timeline.png; returns the exit code."""
    _check(args)
    if args.costs is not None:
        return _run(args)
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(_threads(args))
    try:
        return _run(args)
    finally:
        torch.set_num_threads(previous)  # process-wide: leave it as we found it


def _threads(args: argparse.Namespace) -> int:
    """Torch threads per rank: ``--threads``, else what stallfree train gives each of --devices stage processes."""
    from stallfree.stage_runtime.train.config import stage_threads

    return stage_threads(args.devices, args.threads, args.cores)


def _mib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _run(args: argparse.Namespace) -> int:
    from stallfree.core.atomic import atomic_write
    from stallfree.stage_runtime.plan.asynchronous import ASYNC_SCHEDULES, simulate_async
    from stallfree.stage_runtime.plan.costs import Cores, parse_bytes, parse_link
    from stallfree.stage_runtime.plan.handoff import PLAN_FORMAT
    from stallfree.stage_runtime.plan.planner import Network, rank_plans
    from stallfree.stage_runtime.plan.predict import DEFAULT_LINK
    from stallfree.stage_runtime.plan.timeline import draw_timeline
    from stallfree.stage_runtime.train.schedules import schedule_spec

    calibrated, overhead_for, link = _calibration(args)
    link = parse_link(args.link) if args.link else link or parse_link(DEFAULT_LINK)
    cross = parse_link(args.cross_link, "--cross-link") if args.cross_link else link
    sites = args.sites if args.sites is not None else (2 if args.cross_link else 1)
    network = Network(args.devices, link, cross, sites)
    limit = parse_bytes(args.memory_per_device) if args.memory_per_device else None
    cores = Cores(args.cores, _threads(args)) if args.cores else None
    piloted, overhead_for = _pilots(args, link, cores, overhead_for)
    layers_for, optimizer_s, source = _layer_source(args)
    skipped: list[str] = []
    plans = rank_plans(layers_for, optimizer_s, args.batch_size, network, limit, args.schedules,
                       args.microbatches, args.virtual_stages, top=args.top, skipped=skipped,
                       overhead=overhead_for, cores=cores)
    best = plans[0]
    out = sys.stderr if args.json else sys.stdout
    where = f"{args.devices} devices" + (f" in {sites} sites" if sites > 1 else "")
    links = f"link {link.describe()}" + (f", cross-site {cross.describe()}" if sites > 1 else "")
    memory = f", {args.memory_per_device} per device" if limit else ""
    if cores:
        where += f" sharing {cores.count} cores ({cores.threads} thread{'s' if cores.threads > 1 else ''} a rank)"
    model = args.model if args.costs is None else str(args.costs)
    print(f"plan for {model} ({len(layers_for(args.batch_size))} layers), batch {args.batch_size}, {where} "
          f"({links}){memory}: {len(plans)} configurations simulated", file=out)
    if calibrated:
        print(f"host overhead and link calibrated: {calibrated['describe']}", file=out)
    if piloted:
        print(piloted["describe"], file=out)
    if limit and not best.fits:
        print(f"none fits in {args.memory_per_device} per device: the smallest needs "
              f"{_mib(min(max(c.memory_bytes) for c in plans))}; shown fastest first anyway", file=out)
    print(f"{'#':>2}  {'schedule':<16} {'S':>2} {'V':>2} {'M':>3}  {'split':<11} {'balance':<14} {'step ms':>9} "
          f"{'img/s':>9}  {'bubble':>6} {'warm/cool':>9} {'imbal.':>7} {'comm':>6}  {'memory/device':>13} "
          f"{'x-site':>6}", file=out)
    for i, c in enumerate(plans[:args.top], 1):
        b = c.result.bubble
        assert b is not None  # rank_plans splits the top plans' bubbles
        print(f"{i:>2}  {c.schedule:<16} {c.ranks:>2} {c.virtual:>2} {c.microbatches:>3}  {c.split:<11} "
              f"{','.join(map(str, c.balance)):<14} {c.result.step_s * 1e3:>9.3f} {c.images_per_s:>9.1f}  "
              f"{b.total:>6.1%} {b.warmup_cooldown:>9.1%} {b.imbalance:>7.1%} {b.communication:>6.1%}  "
              f"{_mib(max(c.memory_bytes)):>13} {c.cross_cuts:>6}", file=out)
    asynchronous = []
    reference = next((c for c in plans if c.schedule == "1f1b" and c.fits), None)
    if args.asynchronous and reference is not None:
        print(f"asynchronous, simulated only (stallfree train runs none of them), beside the best 1f1b plan "
              f"(S={reference.ranks}, M={reference.microbatches}, balance {','.join(map(str, reference.balance))},"
              f" {reference.images_per_s:.1f} img/s):", file=out)
        for name in ASYNC_SCHEDULES:
            a = simulate_async(name, reference.ranks, reference.microbatches, args.batch_size,
                               reference.costs, network.between, cores=cores)
            asynchronous.append(a.to_dict())
            print(f"    {name:<14} {a.images_per_s:>9.1f} img/s ({a.images_per_s / reference.images_per_s - 1:+.0%})"
                  f"  weight versions {','.join(map(str, a.weight_versions))}  staleness (updates) "
                  f"{','.join(map(str, a.staleness))}  memory/device {_mib(max(a.memory_bytes))}", file=out)
    train = (f"stallfree train DATA --model {args.model} --image-size {args.image_size} --batch-size "
             f"{args.batch_size} --schedule {best.schedule} --stages {best.ranks} --microbatches "
             f"{best.microbatches} --balance {','.join(map(str, best.balance))}"
             + (f" --virtual-stages {best.virtual}" if schedule_spec(best.schedule).stages_fixed is None else ""))
    result = {"format": PLAN_FORMAT, "model": args.model, "image_size": args.image_size, "classes": args.classes,
              "batch_size": args.batch_size, "devices": args.devices, "sites": sites, "link": link.describe(),
              "cross_link": cross.describe(), "memory_per_device": limit, "costs": source,
              "cores": None if cores is None else asdict(cores),
              "optimizer_s": optimizer_s, "calibration": calibrated or None, "pilots": piloted or None,
              "best": best.to_dict(),
              "train_command": train,
              "candidates": [c.to_dict() for c in plans], "skipped": skipped, "asynchronous": asynchronous}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "plan.json", json.dumps(result, indent=1).encode())
    png = draw_timeline(best.result, args.out / "timeline.png",
                        f"{best.schedule}, {best.ranks} ranks x {best.virtual} stages, {best.microbatches} "
                        f"micro-batches, balance {','.join(map(str, best.balance))}: step "
                        f"{best.result.step_s * 1e3:.3f} ms, bubble {best.result.bubble_share:.0%} (predicted)")
    print(f"run the best: {train}  (or: stallfree train DATA --plan {args.out / 'plan.json'})", file=out)
    print(f"wrote {args.out / 'plan.json'} and {png}", file=out)
    if args.json:
        print(json.dumps(result, indent=1))
    return 0
