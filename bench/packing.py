"""Packing efficiency and useful tokens/s of the packed Loader beside padding and the collators users pick, same data.

Three generated length mixes (``--mixes``, whose help states each law; the output states the lengths drawn) are
written into DATA (an empty folder) and ingested as token shards, pre-tokenized ids from a seed (no tokenizer, no
download). Over each mix, five contenders (``--contenders``) read the same documents: stallfree's Loader packed
(``Packing(seq_len=S)``, B rows of S) and padded (documents padded to the batch's longest), torch's DataLoader with
``transformers``' ``DataCollatorForLanguageModeling(mlm=False)`` (padding) and ``DataCollatorWithFlattening``
(padding-free), and TRL's ``pack_dataset(strategy="bfd")`` with its padding-free collator where ``trl`` imports
(``pip install 'stallfree[bench]'``; skipped with a line saying so where it does not). Padded and flattened feeds
take B_pad = round(B * S / the mix's mean length) documents per batch: about as many real tokens as a packed batch
has slots.

Each contender is built, warmed up over ``--warmup`` batches of an untimed pass, then timed over ``--repeats``
passes of one whole epoch each (or ``--batches`` batches), one contender after another. Per pass:

- **efficiency**: real tokens / slots delivered (slots: B*S per packed batch, B_pad*L per padded one, every token
  of a flattened one: 1.0 by construction, but its shape varies batch to batch, which a compiled model or a
  pipeline schedule cannot take);
- **static-shape efficiency**: real tokens / (batches * the largest batch's slots): what is left if every batch
  is padded to one shape;
- **useful tokens/s**: real tokens over the wall seconds of a loop that only takes batches and counts them;
- **cores busy**: CPU seconds of this process and its workers over those wall seconds
  (:func:`stallfree.core.cpu.cpu_seconds`);
- **tokens lost**: the mix's tokens an epoch never delivered (TRL's ``bfd`` truncates documents longer than S).

``--mixes image-text`` (not by default) adds captioned images, each 576 vision tokens counted in S, decoded and
resized to 336x336 by the packed Loader and by a DataLoader with PIL and a padding collator
(:mod:`.packing_vision`); its rows add samples/s.

The table shows medians over the passes. Targets (issue 46): stallfree packed >= 0.95 efficiency on every mix,
and >= 1M useful tokens/s at S = 2048 on the machine's cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from stallfree.bench.packing_feeds import CONTENDERS, Feed, feed, padded_batch_size, skip_reason
from stallfree.bench.packing_mixes import MIXES, MixData, prepare
from stallfree.bench.packing_vision import (
    IMAGE_TEXT,
    VISION_CONTENDERS,
    prepare_image_text,
    print_vision,
    vision_feed,
)
from stallfree.core.cpu import cpu_seconds

__all__ = ["GPU_SCALE", "TARGET", "add_arguments", "run"]

EXAMPLES = """examples:
  stallfree bench packing ./bench-packing --seq-len 2048                 # 20M tokens per mix written there first
  stallfree bench packing ./bench-packing --seq-len 2048 --repeats 3 --json-file packing.json
  stallfree bench packing ./small --seq-len 512 --tokens 500000 --contenders packed padded --json | jq .results
  stallfree bench packing ./bench-vl --mixes image-text --images 1000 --seq-len 2048   # images decoded + resized
"""
TARGET = {"efficiency": 0.95, "tokens_per_s": 1e6, "seq_len": 2048}  # issue 46, item 4
# What one GPU consumes, for scale: an estimate, not a measurement (see _scale()).
GPU_SCALE: dict[str, Any] = {"params": 1e9, "flops_per_token": 6e9, "peak_flops": 989e12, "mfu": 0.4,
                             "gpu": "H100 SXM, dense BF16"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    laws = "; ".join(f"{m.name} ({m.kind}): {m.lengths}" for m in MIXES.values()).replace("%", "%%")
    parser.add_argument("data", type=Path, help="an empty folder: the mixes are written there as token shards "
                        "(a folder a run of the same settings wrote is reused)")
    parser.add_argument("--seq-len", type=int, default=2048, help="S: tokens per packed row")
    parser.add_argument("--batch-size", type=int, default=8, help="B: packed rows per batch")
    parser.add_argument("--tokens", type=int, default=20_000_000,
                        help="tokens per mix: documents are drawn until their lengths reach it")
    parser.add_argument("--mixes", nargs="+", choices=[*MIXES, IMAGE_TEXT.name], default=list(MIXES),
                        help=f"the mixes: {laws}; and {IMAGE_TEXT.name} (not by default): "
                        f"{IMAGE_TEXT.lengths.replace('%', '%%')}, decoded and resized to 336x336 (its contenders: "
                        f"{', '.join(VISION_CONTENDERS)})")
    parser.add_argument("--images", type=int, default=1000,
                        help="the image-text mix's captioned images (one per document)")
    parser.add_argument("--contenders", nargs="+", choices=list(CONTENDERS), default=list(CONTENDERS),
                        help="; ".join(f"{k}: {v}" for k, v in CONTENDERS.items()))
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per contender and mix (the median shows)")
    parser.add_argument("--batches", type=int, default=None,
                        help="batches per timed pass (default: one whole epoch)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches after each contender is built")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="the DataLoaders' num_workers (default: the cores this process may use)")
    parser.add_argument("--seed", type=int, default=0, help="the documents' seed and every contender's shuffle seed")
    parser.add_argument("--vocab-size", type=int, default=32000, help="ids are drawn from 1 .. V - 1 (0 is padding)")


def _check(args: argparse.Namespace) -> None:
    if args.seq_len < 2:
        raise ValueError(f"--seq-len must be >= 2 (tokens per packed row), got {args.seq_len}")
    for flag in ("batch_size", "tokens", "repeats"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    if args.batches is not None and args.batches < 1:
        raise ValueError(f"--batches must be positive (or left out: a whole epoch), got {args.batches}")
    if args.images < 1:
        raise ValueError(f"--images must be positive, got {args.images}")
    if args.warmup < 0 or args.workers < 0:
        raise ValueError(f"--warmup and --workers must be >= 0, got {args.warmup} and {args.workers}")
    if not 2 <= args.vocab_size <= 1 << 31:
        raise ValueError(f"--vocab-size must be in 2 .. 2**31 (ids are 1 .. V - 1), got {args.vocab_size}")


def _pass(made: Feed, limit: int | None, bar: Any) -> dict[str, Any]:
    """One pass (an epoch, or ``limit`` batches): what it delivered, how fast, at what CPU cost."""
    real = slots = batches = largest = images = 0
    low: list[int] = []
    high: list[int] = []
    start, cpu = time.perf_counter(), cpu_seconds()
    for batch in made.epoch():
        n, s, shape = made.count(batch)
        real, slots, batches, largest = real + n, slots + s, batches + 1, max(largest, s)
        images += made.images(batch) if made.images is not None else 0
        low = list(shape) if not low else [min(a, b) for a, b in zip(low, shape, strict=True)]
        high = list(shape) if not high else [max(a, b) for a, b in zip(high, shape, strict=True)]
        bar.update()
        if limit is not None and batches >= limit:
            break
    wall = time.perf_counter() - start
    cores = (cpu_seconds() - cpu) / wall
    return {"batches": batches, "real_tokens": real, "slots": slots, "wall_s": wall, "tokens_per_s": real / wall,
            "cores": cores, "efficiency": real / slots if slots else 0.0,
            "static_efficiency": real / (batches * largest) if batches else 0.0, "shape_min": low, "shape_max": high,
            "whole_epoch": limit is None or batches < limit, "images": images, "samples_per_s": images / wall}


def _measure(name: str, mix: MixData, args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    reason = skip_reason(name)
    if reason is not None:
        return {"skipped": reason}
    with ((vision_feed if mix.mix is IMAGE_TEXT else feed)(name, mix, args) as made,
          tqdm(desc=f"{mix.mix.name}: {CONTENDERS[name]}", unit="batch", file=sys.stderr, mininterval=1.0,
               leave=False, disable=not args.progress) as bar):
        if args.warmup:
            _pass(made, args.warmup, bar)
        passes = [_pass(made, args.batches, bar) for _ in range(args.repeats)]
    whole = [p for p in passes if p["whole_epoch"]]
    lost = int(mix.lengths.sum()) - whole[0]["real_tokens"] if whole else made.dropped
    median = {key: statistics.median(p[key] for p in passes)
              for key in ("tokens_per_s", "cores", "efficiency", "static_efficiency", "samples_per_s")}
    return {**median, "tokens_per_s_per_core": median["tokens_per_s"] / median["cores"] if median["cores"] else None,
            **({"note": made.note} if made.note else {}),
            "lost_tokens": lost, "prep_s": made.prep_s, "passes": passes,
            "shape_min": [min(p["shape_min"][i] for p in passes) for i in range(len(passes[0]["shape_min"]))],
            "shape_max": [max(p["shape_max"][i] for p in passes) for i in range(len(passes[0]["shape_max"]))]}


def _scale() -> dict[str, Any]:
    """Tokens/s one GPU trains a 1B-parameter model at: 6 FLOPs per parameter per token, at ``mfu`` of its peak."""
    s = GPU_SCALE
    tokens = float(s["peak_flops"]) * float(s["mfu"]) / float(s["flops_per_token"])
    return {**s, "tokens_per_s": tokens, "node_of_8_tokens_per_s": 8 * tokens, "estimate": True}


def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    """Run the benchmark, print its table to ``out`` and return the results (JSON-able)."""
    _check(args)
    mixes = prepare(args.data, [m for m in args.mixes if m in MIXES], tokens=args.tokens, seq_len=args.seq_len,
                    seed=args.seed, vocab=args.vocab_size, progress=args.progress)
    if IMAGE_TEXT.name in args.mixes:
        mixes[IMAGE_TEXT.name] = prepare_image_text(args.data, images=args.images, seed=args.seed,
                                                    progress=args.progress)
    results = []
    for name, mix in mixes.items():
        for contender in args.contenders:
            if mix.mix is IMAGE_TEXT and contender not in VISION_CONTENDERS:
                continue  # a token-only contender: it has no images to decode
            if args.progress:
                print(f"{name}: {CONTENDERS[contender]} ...", file=sys.stderr)
            label = (VISION_CONTENDERS if mix.mix is IMAGE_TEXT else CONTENDERS)[contender]
            results.append({"mix": name, "contender": contender, "label": label,
                            **_measure(contender, mix, args)})
    stats = {name: {**mix.stats(args.seq_len),
                    "padded_batch_size": padded_batch_size(args.batch_size, args.seq_len, float(mix.lengths.mean()))}
             for name, mix in mixes.items()}
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
              f"{len(os.sched_getaffinity(0))} cores, load average {os.getloadavg()[0]:.2f} at the end",
              "seq_len": args.seq_len, "batch_size": args.batch_size, "workers": args.workers,
              "repeats": args.repeats, "batches": args.batches, "tokens_per_mix": args.tokens, "seed": args.seed,
              "vocab_size": args.vocab_size, "images": args.images if IMAGE_TEXT.name in mixes else None,
              "mixes": stats, "results": results, "gpu_scale": _scale(),
              "targets": _targets(results, args.seq_len)}
    _print(result, out)
    return result


def _targets(results: list[dict[str, Any]], seq_len: int) -> dict[str, Any]:
    packed = [r for r in results if r["contender"] == "packed" and "skipped" not in r and r["mix"] in MIXES]
    if not packed:
        return {}
    efficiency = min(r["efficiency"] for r in packed)
    rate = min(r["tokens_per_s"] for r in packed)
    return {"efficiency": {"goal": TARGET["efficiency"], "lowest": efficiency,
                           "met": efficiency >= TARGET["efficiency"]},
            "tokens_per_s": {"goal": TARGET["tokens_per_s"], "lowest": rate, "met": rate >= TARGET["tokens_per_s"],
                             "at_goal_seq_len": seq_len == TARGET["seq_len"]}}


def _shape(r: dict[str, Any]) -> str:
    def dim(lo: int, hi: int) -> str:
        return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"

    return "[" + ", ".join(dim(lo, hi) for lo, hi in zip(r["shape_min"], r["shape_max"], strict=True)) + "]"


def _print(result: dict[str, Any], out: TextIO) -> None:
    s, b = result["seq_len"], result["batch_size"]
    print(f"S = {s}, B = {b} packed rows; {result['machine']}; DataLoader workers {result['workers']}; medians of "
          f"{result['repeats']} passes of {result['batches'] or 'one epoch'} each; {result['date']}", file=out)
    for name, m in result["mixes"].items():
        print(f"- {name} ({m['kind']}): {m['lengths']}. Drawn: {m['documents']:,} documents, {m['tokens']:,} "
              f"tokens, mean {m['mean']:.0f}, median {m['p50']:,}, p95 {m['p95']:,}, max {m['max']:,}; "
              f"{m['longer_than_seq_len']:.1%} longer than S; B_pad = {m['padded_batch_size']}", file=out)
    print("\n| mix | contender | batch shape | efficiency | static-shape efficiency | useful Mtok/s | cores busy | "
          "Mtok/s per core | tokens lost |", file=out)
    print("|---|---|---|---:|---:|---:|---:|---:|---:|", file=out)
    for r in result["results"]:
        if "skipped" in r:
            print(f"| {r['mix']} | {r['label']} | skipped: {r['skipped']} | | | | | | |", file=out)
            continue
        per_core = "" if r["tokens_per_s_per_core"] is None else f"{r['tokens_per_s_per_core'] / 1e6:.2f}"
        print(f"| {r['mix']} | {r['label']} | {_shape(r)} | {r['efficiency']:.3f} | {r['static_efficiency']:.3f} | "
              f"{r['tokens_per_s'] / 1e6:.2f} | {r['cores']:.2f} | {per_core} | {r['lost_tokens']:,} |", file=out)
    print_vision(result, out)
    print("\nThe flattened contenders' efficiency is 1.0 by construction (no padding slot), but their batch shape "
          "varies; the static-shape column pads every batch to the largest.", file=out)
    trl = [f"{r['mix']} {r['prep_s']:.1f} s" for r in result["results"] if r["contender"] == "trl-bfd"
           and "skipped" not in r]
    if trl:
        print(f"TRL's bfd packs once before the loop ({', '.join(trl)}, not in the rates) and truncates documents "
              "longer than S (the tokens lost).", file=out)
    g = result["gpu_scale"]
    print(f"For scale (an estimate, not measured): a 1B-parameter model trains at ~{g['flops_per_token']:.0e} FLOPs "
          f"per token (6 per parameter); an {g['gpu']} peak of {g['peak_flops'] / 1e12:.0f} TFLOP/s at "
          f"{g['mfu']:.0%} MFU gives ~{g['tokens_per_s'] / 1e3:.0f}k tokens/s per GPU (attention at S = 2048 adds "
          f"~20% FLOPs: ~55k), ~{g['node_of_8_tokens_per_s'] / 1e6:.2f}M for a node of 8.", file=out)
    t = result["targets"]
    if t:
        e, r = t["efficiency"], t["tokens_per_s"]
        at = "" if r["at_goal_seq_len"] else f" (measured at S = {s}, the goal is at S = {TARGET['seq_len']})"
        print(f"Targets, stallfree packed: efficiency >= {e['goal']} on every mix: lowest {e['lowest']:.3f}, "
              f"{'met' if e['met'] else 'not met'}; >= {r['goal'] / 1e6:.0f}M useful tokens/s: lowest "
              f"{r['lowest'] / 1e6:.2f}M, {'met' if r['met'] else 'not met'}{at}.", file=out)
