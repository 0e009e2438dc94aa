"""Step time and throughput of packs balanced by compute, by tokens or not at all, against the ideal, same documents.

Two generated length mixes (``--mixes``; their laws in this help and in the output, drawn from a seed, nothing
downloaded) are fed through the Loader packed with ``balance=None``, ``"tokens"`` and ``"compute"`` on two layouts:
``dp4`` (4 data-parallel ranks, 1 micro-batch) and ``dp2-pp2`` (2 data-parallel ranks, each a pipeline of 2 stages,
``--microbatches`` M per step). Every batch of an epoch is delivered on every rank and read back: each micro-batch's
documents from ``document_index`` and ``position_ids`` (so the figures are what the Loader delivers, every document
checked once). The image-text mix is written as image-text shards (its documents' text and images, in a
temporary folder) and read as the Loader reads any image-text source, ``Packing(image_tokens=, image_token_id=)``:
its balance knows each document's images and charges them ``Cost.image``, as in training.

The simulated accelerator (what ``--accelerator sim:...`` charges a token micro-batch, padding free)::

    cost of a document of l tokens and k images = l + l**2 / S + IMAGE_COST * k       (Cost.attention(S), + images:
                                                                   attention as costly as the rest at l = S)
    a rank does --rate cost units per second (a cost unit: one token's linear work)
    step = sum over micro-batch slots m of (max over ranks r of unit (r, m))   (DP: the slowest rank, at the
           all-reduce; a pipeline: each slot waits for its slowest micro-batch; the fill-and-drain bubble, the
           same for every balance, is left out)
    ideal = the epoch's total cost / ranks                        (every unit as busy as the mean, no extra step)

Per mix, layout and balance (medians over ``--seeds`` seeds, each its own documents and order): steps per epoch,
mean step time, useful tokens/s (the epoch's tokens over its simulated seconds), slowest/ideal (the epoch's time
over the ideal's), the gain over ``"tokens"`` as a share of the ideal's gain ((T_tokens - T) / (T_tokens -
T_ideal)), the padding share, the slowest/ideal if padding cost its linear part, and planning per step (the plan
made again in CPU seconds, as a share of the simulated step; and the Loader's own wall seconds, balance.seconds).
Targets (issue 48): with ``"compute"``, slowest/ideal <= 1.05 on every mix, a gain >= 90% of the ideal's, planning
< 2% of the step.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any, TextIO

from stallfree.bench.balance_mixes import IMAGE_TOKENS, MIXES, image_tokens

__all__ = ["EXAMPLES", "LAYOUTS", "TARGET", "add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench balance                                   # S = 4096, 8M tokens per mix, 3 seeds
  stallfree bench balance --seq-len 8192 --microbatches 8 --json-file balance.json
  stallfree bench balance --tokens 200000 --seeds 1 --mixes chat --layouts dp4 --json | jq .results
"""
TARGET = {"slowest_over_ideal": 1.05, "gain": 0.90, "plan_share": 0.02}  # issue 48, item 4
#: name: (data-parallel ranks, pipeline stages); the micro-batches are 1 without stages, else --microbatches
LAYOUTS = {"dp4": (4, 1), "dp2-pp2": (2, 2)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    laws = "; ".join(f"{m.name}: {m.law}" for m in MIXES.values()).replace("%", "%%")
    parser.add_argument("--seq-len", type=int, default=4096, help="S: tokens per packed row")
    parser.add_argument("--batch-size", type=int, default=8, help="B: packed rows per rank's batch")
    parser.add_argument("--microbatches", type=int, default=4,
                        help="M: micro-batches per batch on the pipeline layout (B/M rows each)")
    parser.add_argument("--tokens", type=int, default=8_000_000,
                        help="tokens per mix: documents are drawn until their lengths reach it")
    parser.add_argument("--mixes", nargs="+", choices=list(MIXES), default=list(MIXES), help=f"the mixes: {laws}")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS),
                        help="dp4: 4 data-parallel ranks; dp2-pp2: 2 data-parallel ranks x 2 pipeline stages")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1: documents and order (the median shows)")
    parser.add_argument("--rate", type=float, default=50_000.0,
                        help="the simulated accelerator: cost units per second per rank (a unit: one token's linear "
                        "work; 50,000 is about one H100 training a 1B-parameter model)")
    parser.add_argument("--image-cost", type=float, default=512.0,
                        help=f"Cost.image: an image's vision-encoder work in cost units (its {IMAGE_TOKENS} positions, "
                        "S/16 below S = 4096, are in its document's length besides)")


def _check(args: argparse.Namespace) -> None:
    if args.seq_len < 2:
        raise ValueError(f"--seq-len must be >= 2 (tokens per packed row), got {args.seq_len}")
    for flag in ("batch_size", "microbatches", "tokens", "seeds"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if "dp2-pp2" in args.layouts and args.batch_size % args.microbatches:
        raise ValueError(f"--batch-size {args.batch_size} does not split into --microbatches {args.microbatches} "
                         "micro-batches of equal rows: give a batch size that M divides")
    if "image-text" in args.mixes and args.seq_len < 32:
        raise ValueError(f"--seq-len {args.seq_len} is too short for the image-text mix, whose documents of 12 "
                         "images must fit a row: give --seq-len >= 32, or --mixes chat")
    if not args.rate > 0 or args.image_cost < 0:
        raise ValueError(f"--rate must be > 0 and --image-cost >= 0, got {args.rate} and {args.image_cost}")


def _contenders(mix: str) -> list[str]:
    return ["none", "tokens", "compute"]


def _one(fed: Any, lengths: Any, images: Any, cost: Any, world: int, slots: int, rate: float,
         comparable: bool) -> dict[str, Any]:
    """One contender's epoch under the simulated accelerator (``comparable``: its plan's costs are the simulator's)."""
    import numpy as np

    fed.units.check_once(lengths)
    costs = fed.units.costs(cost, images)  # [steps, W, M]
    step = costs.max(axis=1).sum(axis=1)
    epoch, ideal = float(step.sum()) / rate, float(costs.sum()) / world / rate
    # the same epoch if every empty slot cost its linear part (a model that computes padding)
    padded = costs + cost.linear * (slots - fed.units.tokens())
    matches = None
    if comparable and fed.planned is not None:
        shape = (len(step), costs.shape[1] * costs.shape[2])
        matches = fed.planned.shape == shape and bool(np.allclose(fed.planned, costs.reshape(shape)))
    tokens = int(lengths.sum())
    return {"steps": len(step), "step_s": epoch / len(step), "epoch_s": epoch, "ideal_s": ideal,
            "slowest_over_ideal": epoch / ideal, "tokens_per_s": tokens / epoch, "ideal_tokens_per_s": tokens / ideal,
            "padding": fed.units.padding(slots),
            "padding_charged_over_ideal": float(padded.max(axis=1).sum(axis=1).sum()) / rate / ideal,
            "plan_s": fed.plan_seconds, "plan_cpu_s": fed.plan_cpu_seconds,
            "plan_ms_per_step": 1e3 * fed.plan_cpu_seconds / len(step), "plan_share": fed.plan_cpu_seconds / epoch,
            "plan_wall_ms_per_step": 1e3 * fed.plan_seconds / len(step), "plan_wall_share": fed.plan_seconds / epoch,
            "planned_matches": matches}


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return the results (JSON-able)."""
    import tempfile
    from pathlib import Path

    from tqdm import tqdm

    from stallfree.bench.balance_feeds import CONTENDERS, GeneratedDocuments, feed
    from stallfree.bench.balance_images import write_mix
    from stallfree.bench.balance_mixes import draw
    from stallfree.core.cost import Cost

    _check(args)
    cost = Cost(1.0, 1.0 / args.seq_len, float(args.image_cost))
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {
        (m, lay, c): [] for m in args.mixes for lay in args.layouts for c in _contenders(m)}
    stats: dict[str, Any] = {}
    with tqdm(total=len(runs) * args.seeds, desc="bench balance", unit="epoch", file=sys.stderr,
              disable=not args.progress) as bar, tempfile.TemporaryDirectory(prefix="bench-balance-") as tmp:
        for mix in args.mixes:
            for seed in range(args.seeds):
                drawn = draw(mix, args.tokens, args.seq_len, seed)
                if seed == 0:
                    stats[mix] = _stats(mix, drawn, args.seq_len)
                images = drawn.images if MIXES[mix].images else None
                source = (write_mix(drawn, Path(tmp) / f"{mix}-{seed}") if images is not None else
                          GeneratedDocuments(drawn.lengths, f"{mix}-{seed}"))
                for layout in args.layouts:
                    world, stages = LAYOUTS[layout]
                    m = 1 if stages == 1 else args.microbatches
                    for contender in _contenders(mix):
                        bar.set_postfix_str(f"{mix}, {layout}, {contender}, seed {seed}")
                        fed = feed(contender, drawn, source, seq_len=args.seq_len, batch_size=args.batch_size,
                                   world_size=world, microbatches=m, cost=cost, seed=seed)
                        runs[mix, layout, contender].append(
                            _one(fed, drawn.lengths, images, cost, world, args.batch_size // m * args.seq_len,
                                 args.rate, contender == "compute"))
                        bar.update()
                    _gains(runs, mix, layout)
    results = [{"mix": mix, "layout": layout, "contender": c, "label": CONTENDERS[c], **_median(r), "seeds": r}
               for (mix, layout, c), r in runs.items()]
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
              f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.2f} at the end",
              "seq_len": args.seq_len, "batch_size": args.batch_size, "microbatches": args.microbatches,
              "tokens_per_mix": args.tokens, "seeds": args.seeds, "rate": args.rate,
              "cost": {"linear": cost.linear, "quadratic": cost.quadratic, "image": cost.image},
              "image_tokens": image_tokens(args.seq_len), "layouts": {k: LAYOUTS[k] for k in args.layouts},
              "mixes": stats, "results": results, "targets": _targets(results)}
    _print(result, out)
    return result


def _gains(runs: dict[tuple[str, str, str], list[dict[str, Any]]], mix: str, layout: str) -> None:
    """The latest seed's gain over "tokens" of each contender, as a share of the ideal's gain."""
    base = runs[mix, layout, "tokens"][-1]
    room = base["epoch_s"] - base["ideal_s"]
    for c in _contenders(mix):
        r = runs[mix, layout, c][-1]
        r["gain"] = (base["epoch_s"] - r["epoch_s"]) / room if room > 0 else None


def _median(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in seeds[0].items():
        values = [s[key] for s in seeds]
        if isinstance(value, bool) or value is None or any(v is None for v in values):
            out[key] = all(values) if isinstance(value, bool) else None if all(v is None for v in values) else values
        else:
            out[key] = statistics.median(values)
    return out


def _stats(name: str, drawn: Any, seq_len: int) -> dict[str, Any]:
    import numpy as np

    n = drawn.lengths
    return {"law": MIXES[name].law, "documents": len(n), "tokens": int(n.sum()), "mean": float(n.mean()),
            "p50": int(np.percentile(n, 50)), "p95": int(np.percentile(n, 95)), "max": int(n.max()),
            "near_or_past_seq_len": float((n >= 0.75 * seq_len).mean()), "images": int(drawn.images.sum()),
            "images_per_document": float(drawn.images.mean())}


def _targets(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each balance by compute against the issue's targets, mix by mix (``"compute on chat"``)."""
    out: dict[str, Any] = {}
    for c in ("compute",):
        for mix in dict.fromkeys(r["mix"] for r in results):
            rows = [r for r in results if r["contender"] == c and r["mix"] == mix]
            if not rows:
                continue
            worst = max(r["slowest_over_ideal"] for r in rows)
            gains = [r["gain"] for r in rows if isinstance(r["gain"], float)]
            share = max(r["plan_share"] for r in rows)
            out[f"{c} on {mix}"] = {
                "slowest_over_ideal": {"goal": TARGET["slowest_over_ideal"], "worst": worst,
                                       "met": worst <= TARGET["slowest_over_ideal"]},
                "gain": {"goal": TARGET["gain"], "lowest": min(gains) if gains else None,
                         "met": bool(gains) and min(gains) >= TARGET["gain"]},
                "plan_share": {"goal": TARGET["plan_share"], "highest": share, "met": share < TARGET["plan_share"]}}
    return out


def _layout(name: str, microbatches: int) -> str:
    world, stages = LAYOUTS[name]
    return f"DP {world}" if stages == 1 else f"{world} DP x {stages} stages, M = {microbatches}"


def _print(result: dict[str, Any], out: TextIO) -> None:
    from stallfree.bench.balance_images import IMAGE_TOKEN_ID, SIDE

    s, b, m = result["seq_len"], result["batch_size"], result["microbatches"]
    c = result["cost"]
    print(f"S = {s}, B = {b} rows per rank's batch; {result['tokens_per_mix']:,} tokens per mix; medians of "
          f"{result['seeds']} seeds; {result['machine']}; {result['date']}", file=out)
    print(f"Simulated accelerator: a document of l tokens and k images costs {c['linear']:g} * l + l**2 / {s} + "
          f"{c['image']:g} * k (attention as costly as the rest at l = S; padding free); a rank does "
          f"{result['rate']:,.0f} cost units per second; a step is the sum over micro-batch slots of the slowest "
          "rank's micro-batch (the pipeline's fill-and-drain bubble left out); ideal = total cost / ranks.", file=out)
    for name, x in result["mixes"].items():
        imgs = f", {x['images']:,} images ({x['images_per_document']:.2f} per document)" if x["images"] else ""
        print(f"- {name}: {x['law']}. Drawn (seed 0): {x['documents']:,} documents, {x['tokens']:,} tokens, mean "
              f"{x['mean']:.0f}, median {x['p50']:,}, p95 {x['p95']:,}, max {x['max']:,}; "
              f"{x['near_or_past_seq_len']:.1%} at 0.75 S or longer{imgs}", file=out)
    if any(MIXES[name].images for name in result["mixes"]):
        print(f"  The image-text mix is written as image-text shards (each document's text, and its k images, "
              f"{SIDE}x{SIDE} PNGs, before it) and read by the Loader with Packing(image_tokens="
              f"{result['image_tokens']}, image_token_id={IMAGE_TOKEN_ID}): its balance knows every document's "
              "images (Cost.image each), as in training.", file=out)
    print("\n| mix | layout | balance | steps | step s | useful ktok/s | slowest/ideal | gain over tokens (share of "
          "ideal's) | padding | slowest/ideal, padding charged | planning CPU ms/step (% of step) | planning wall "
          "ms/step | planned = delivered |",
          file=out)
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|", file=out)
    for r in result["results"]:
        gain = "" if not isinstance(r["gain"], float) or r["contender"] == "tokens" else f"{r['gain']:.0%}"
        match = {True: "yes", False: "no"}.get(r["planned_matches"], "")
        print(f"| {r['mix']} | {_layout(r['layout'], m)} | {r['label']} | {r['steps']:.0f} | {r['step_s']:.3f} | "
              f"{r['tokens_per_s'] / 1e3:.1f} | {r['slowest_over_ideal']:.3f} | {gain} | {r['padding']:.1%} | "
              f"{r['padding_charged_over_ideal']:.3f} | {r['plan_ms_per_step']:.2f} ({r['plan_share']:.2%}) | "
              f"{r['plan_wall_ms_per_step']:.2f} | {match} |", file=out)
    ideal = {(r["mix"], r["layout"]): r["ideal_tokens_per_s"] for r in result["results"]}
    print("Ideal useful ktok/s: " + "; ".join(f"{mix}, {_layout(lay, m)}: {v / 1e3:.1f}"
                                             for (mix, lay), v in ideal.items()), file=out)
    for name, t in result["targets"].items():
        a, g, p = t["slowest_over_ideal"], t["gain"], t["plan_share"]
        lowest = "none measured" if g["lowest"] is None else f"lowest {g['lowest']:.0%}"
        print(f"Targets, {name}: slowest/ideal <= {a['goal']}: worst {a['worst']:.3f}, "
              f"{'met' if a['met'] else 'not met'}; gain >= {g['goal']:.0%} of the ideal's: {lowest}, "
              f"{'met' if g['met'] else 'not met'}; planning < {p['goal']:.0%} of the step (CPU): highest "
              f"{p['highest']:.2%}, {'met' if p['met'] else 'not met'}.", file=out)
