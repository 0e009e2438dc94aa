"""``stallfree plan``: simulate every schedule for a model and a set of devices; rank them; draw the best."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from stallfree.commands.output import add_progress_argument
from stallfree.core.device import check_device
from stallfree.stage_runtime.schedules import FLUSHING

if TYPE_CHECKING:
    from stallfree.stage_runtime.plan.plan import PlanResult

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
  stallfree plan --tokens ./tokens --seq-len 2048 --attention-span 2048 --batch-size 8 --microbatches 2 --dp 4
  stallfree plan --tokens ./tokens --fit ./stallfree-train       # the cost a finished token job's steps measured
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
    p = sub.add_parser(
        "plan",
        help="predict step time, bubble and memory of every pipeline schedule, and pick one",
        description="Measure the model's layers (the partitioner's measurement, as stallfree train does) or read "
        "them from --costs, then simulate one training step for every schedule, pipeline rank count, virtual "
        "stage count, micro-batch count and split, over the links you describe. Prints the fastest that fit in "
        "--memory-per-device with their bubble split into warm-up/cool-down, imbalance and communication, and "
        "the asynchronous schedules PipeDream-2BW (stallfree train --schedule 2bw) and async 1F1B (simulated "
        "only) beside them. Writes plan.json "
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
    # the schedules that flush are the ones the planner ranks (plan.planner.SYNC_SCHEDULES); 2bw is simulated apart
    p.add_argument("--schedules", type=lambda t: t.split(","), default=list(FLUSHING),
                   help=f"comma-separated, from {','.join(FLUSHING)} (default all)")
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
    p.add_argument("--tokens", metavar="DATA", default=None,
                   help="plan the data side of a token job on DATA (what stallfree train DATA --model gpt_tiny "
                   "reads) instead: what each --balance-batches choice costs its steps, the replicas' wait for the "
                   "slowest at the all-reduce (the books' data-parallel imbalance) and the padding, from the "
                   "epoch's batches as the job's Loaders make them (no model runs), under the simulated device's "
                   "cost, l + l^2/A per document of l tokens and a padding slot its linear part (docs/plan.md); "
                   "--batch-size is then rows per replica's step and --microbatches one count")
    p.add_argument("--seq-len", type=int, default=2048, help="with --tokens: the packed row's length (default 2048)")
    p.add_argument("--attention-span", type=int, default=None,
                   help="with --tokens: A in l + l^2/A, as stallfree train's (default --seq-len)")
    p.add_argument("--dp", type=int, default=2, help="with --tokens: data-parallel replicas (default 2)")
    p.add_argument("--seed", type=int, default=0, help="with --tokens: the job's --seed (default 0)")
    p.add_argument("--fit", type=Path, default=None, metavar="RUN_DIR",
                   help="with --tokens: fit the cost of a document (l + l^2/A, in seconds) to the measured steps of "
                   "the finished token job RUN_DIR (its --out) on DATA, and print it with the --attention-span it "
                   "implies")
    add_progress_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Plan (:func:`stallfree.plan`), print the table, write plan.json and timeline.png; returns the exit code."""
    from stallfree.stage_runtime.plan.plan import plan  # imports torch: `stallfree --help` stays without it

    if args.fit is not None and args.tokens is None:
        raise ValueError("--fit RUN_DIR fits a token job's cost: give --tokens DATA too (the job's token source)")
    if args.tokens is not None:
        return _fit_tokens(args) if args.fit is not None else _run_tokens(args)
    if args.costs is None:  # measured here: a GPU this machine lacks fails in one line, before any measurement
        check_device(args.device, instead="--costs FILE with the per-layer costs measured on a GPU")
    result = plan(args.model, costs=args.costs, image_size=args.image_size, classes=args.classes,
                  batch_size=args.batch_size, devices=args.devices, sites=args.sites, link=args.link,
                  cross_link=args.cross_link, memory_per_device=args.memory_per_device,
                  calibration=args.calibration, pilots=args.pilots or (), schedules=args.schedules,
                  microbatches=args.microbatches, virtual_stages=args.virtual_stages, device=args.device,
                  threads=args.threads, cores=args.cores, top=args.top, asynchronous=args.asynchronous,
                  progress=(lambda line: print(line, file=sys.stderr)) if args.progress else None)
    out = sys.stderr if args.json else sys.stdout
    _print(args, result, out)
    path, png = result.write(args.out)
    print(f"run the best: {result.train_command}  (or: stallfree train DATA --plan {path})", file=out)
    print(f"wrote {path} and {png}", file=out)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    return 0


def _run_tokens(args: argparse.Namespace) -> int:
    """``--tokens DATA``: each balance's predicted data-parallel imbalance and padding; returns the exit code."""
    from stallfree.stage_runtime.plan.data_balance import predict_data_balance  # torch, the Loader: imported late

    if len(args.microbatches) != 1:
        raise ValueError("--tokens plans one job: give --microbatches one count (e.g. --microbatches 2)")
    for flag, value in (("--seq-len", args.seq_len), ("--dp", args.dp), ("--batch-size", args.batch_size),
                        ("--attention-span", args.attention_span or 1)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.progress:
        print(f"reading the epoch's batches of {args.tokens} as {args.dp} replicas' Loaders make them...",
              file=sys.stderr)
    results = predict_data_balance(args.tokens, seq_len=args.seq_len, batch_size=args.batch_size, dp=args.dp,
                                   microbatches=args.microbatches[0], attention_span=args.attention_span,
                                   seed=args.seed)
    out = sys.stderr if args.json else sys.stdout
    span = args.attention_span or args.seq_len
    print(f"{args.tokens}: --dp {args.dp}, --batch-size {args.batch_size} rows of --seq-len {args.seq_len}, "
          f"--microbatches {args.microbatches[0]}, cost l + l^2/{span} per document", file=out)
    print(f"{'--balance-batches':<18}{'steps':>7}{'data-parallel imbalance':>25}{'padding':>9}"
          f"{'real tokens per work unit':>27}", file=out)
    for r in results:
        print(f"{r.balance:<18}{r.steps:>7}{r.dp_imbalance:>25.1%}{r.padding:>9.1%}"
              f"{r.real_tokens / r.work if r.work else 0.0:>27.3f}", file=out)
    print("shares of the step before host runtime and input (the measured books add those); real tokens per work "
          "unit times the device's rate (sim:R) is the job's real tokens/s at best", file=out)
    if args.json:
        print(json.dumps([r.to_dict() for r in results], indent=1))
    return 0


def _fit_tokens(args: argparse.Namespace) -> int:
    """``--tokens DATA --fit RUN_DIR``: the cost the job's measured steps fit; returns the exit code."""
    from stallfree.stage_runtime.plan.data_balance import fit_cost  # torch, the Loader: imported late

    if args.progress:
        print(f"reading {args.fit}'s steps and making their batches of {args.tokens} again...", file=sys.stderr)
    cost, steps = fit_cost(args.fit, args.tokens)
    span = cost.linear / cost.quadratic if cost.quadratic > 0 else None
    fitted = {"linear_s": cost.linear, "quadratic_s": cost.quadratic, "steps": steps,
              "attention_span": round(span) if span is not None else None}
    out = sys.stderr if args.json else sys.stdout
    print(f"{args.fit}: {steps} steps fitted: a document of l tokens costs {cost.linear:.3g} s * l + "
          f"{cost.quadratic:.3g} s * l^2 (replica 0's step, its host's fixed cost in the linear term)", file=out)
    if span is not None:
        print(f"as stallfree train's cost model: --attention-span {round(span)} "
              f"(stallfree.Cost.attention({round(span)})), {1 / cost.linear:,.0f} tokens/s at the linear rate",
              file=out)
    else:
        print("no quadratic term fitted: attention cost nothing measurable at these lengths", file=out)
    if args.json:
        print(json.dumps(fitted, indent=1))
    return 0


def _mib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _print(args: argparse.Namespace, result: PlanResult, out: TextIO) -> None:
    """The table: the inputs, the top plans with their bubble's causes, the asynchronous schedules."""
    plans, best, network, cores = result.candidates, result.best, result.network, result.cores
    where = f"{network.devices} devices" + (f" in {network.sites} sites" if network.sites > 1 else "")
    links = (f"link {network.link.describe()}"
             + (f", cross-site {network.cross_link.describe()}" if network.sites > 1 else ""))
    memory = f", {args.memory_per_device} per device" if result.memory_limit else ""
    if cores:
        where += f" sharing {cores.count} cores ({cores.threads} thread{'s' if cores.threads > 1 else ''} a rank)"
    model = args.model if args.costs is None else str(args.costs)
    print(f"plan for {model} ({result.layers} layers), batch {args.batch_size}, {where} "
          f"({links}){memory}: {len(plans)} configurations simulated", file=out)
    if result.calibration:
        print(f"host overhead and link calibrated: {result.calibration['describe']}", file=out)
    if result.pilots:
        print(result.pilots["describe"], file=out)
    if result.memory_limit and not best.fits:
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
    reference = result.reference
    if result.asynchronous and reference is not None:
        print(f"asynchronous (stallfree train runs pipedream-2bw as --schedule 2bw), beside the best 1f1b plan "
              f"(S={reference.ranks}, M={reference.microbatches}, balance {','.join(map(str, reference.balance))},"
              f" {reference.images_per_s:.1f} img/s):", file=out)
        for a in result.asynchronous:
            print(f"    {a.name:<14} {a.images_per_s:>9.1f} img/s ({a.images_per_s / reference.images_per_s - 1:+.0%})"
                  f"  weight versions {','.join(map(str, a.weight_versions))}  staleness (updates) "
                  f"{','.join(map(str, a.staleness))}  memory/device {_mib(max(a.memory_bytes))}", file=out)
