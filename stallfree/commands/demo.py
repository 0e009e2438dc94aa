"""``stallfree demo``: the whole job on built-in synthetic data, from one command.

1. Loader beside torch's DataLoader: ImageNet-sized synthetic JPEGs, the standard train augmentation, img/s.
2. Ingest: a learnable synthetic dataset (shapes in random colours) into Arrow shards.
3. Train: a small CNN split into 2 pipeline stages with 1F1B, fed by the Loader over those shards, with
   evaluation on a held-out split and the report (input stall, pipeline bubble, accuracy against chance).

With STALLFREE_DEMO_QUICK=1 in the environment the defaults shrink to --images 64 --epochs 1: every step still
runs, on less data, in about half a minute (CI runs the README's set-up line so; the accuracy is then near chance).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from stallfree.commands.output import add_json_arguments, add_progress_argument, emit, human, require_writable

__all__ = ["register"]

QUICK = "STALLFREE_DEMO_QUICK"
# (--images, --epochs) when the flags are not given: as documented, and with QUICK=1
DEFAULTS, QUICK_DEFAULTS = (640, 6), (64, 1)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stallfree demo``."""
    parser = sub.add_parser(
        "demo",
        help="run stallfree end to end on built-in synthetic data",
        description=__doc__,
        epilog="examples:\n  stallfree demo\n  stallfree demo --out ./demo --images 1280 --epochs 8\n"
        "  stallfree demo --skip-bench --json | jq .train.eval_top1\n"
        "  stallfree demo --vision --keep-data     # captions of generated images: the stem, the packs, the loss",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("stallfree-demo"),
                        help="where the results stay: the chart (e2e.png), the training run (run/: summary.json, "
                        "trace.json, checkpoints) and demo.json (default ./stallfree-demo)")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the generated datasets under OUT/data (default: a temporary folder, removed at the "
                        "end)")
    parser.add_argument("--images", type=int,
                        help=f"ImageNet-sized JPEGs for the loader comparison (default {DEFAULTS[0]}; "
                        f"{QUICK_DEFAULTS[0]} with {QUICK}=1)")
    parser.add_argument("--epochs", type=int,
                        help=f"training epochs (default {DEFAULTS[1]}; {QUICK_DEFAULTS[1]} with {QUICK}=1)")
    parser.add_argument("--skip-bench", action="store_true", help="skip step 1, the end-to-end comparison")
    parser.add_argument("--vision", action="store_true",
                        help="the vision-language demo instead: --images captioned images of coloured shapes (\"a red "
                        "circle on the left\") generated, ingested as image-text shards, and vlm_tiny (a transformer "
                        "whose patch-embedding stem turns each image into tokens) trained on them in 2 pipeline "
                        "stages through the Loader's image-text packs (run-vision/ under --out)")
    add_json_arguments(parser)
    add_progress_argument(parser)
    parser.set_defaults(func=_demo)


def _step(title: str) -> None:
    print(f"\n== {title}", file=sys.stderr, flush=True)


def _sizes(args: argparse.Namespace) -> tuple[int, int]:
    """(images, epochs): the flags', else the defaults, the quick ones when the environment asks for them."""
    quick = os.environ.get(QUICK, "")
    if quick not in ("", "0", "1"):
        raise ValueError(f"{QUICK} must be 1 (a quick demo on less data) or 0, got {quick!r}")
    images, epochs = QUICK_DEFAULTS if quick == "1" else DEFAULTS
    images = images if args.images is None else args.images
    epochs = epochs if args.epochs is None else args.epochs
    if images < 64:
        raise ValueError(f"--images must be at least one batch of 64, got {images}")
    if epochs < 1:
        raise ValueError(f"--epochs must be positive, got {epochs}")
    return images, epochs


def _demo(args: argparse.Namespace) -> int:
    images, epochs = _sizes(args)
    require_writable(args.out, "--out")  # a read-only current folder, where the default --out goes
    if args.vision:
        from stallfree.commands.demo_vision import vision_demo

        return vision_demo(args, images, epochs)
    from stallfree.core.atomic import atomic_write
    from stallfree.core.dali import require_dali

    require_dali()  # before minutes of writing JPEGs, not after
    from stallfree.bench import e2e
    from stallfree.commands.bench import options
    from stallfree.commands.kernels import announce_compiles
    from stallfree.ingest.runner import ingest
    from stallfree.ingest.synthetic import make_image_folder
    from stallfree.stage_runtime.jobs import train, with_prediction
    from stallfree.stage_runtime.train.report import format_summary
    from stallfree.stage_runtime.train.trainer import demo_config

    announce_compiles(args.progress)
    out = human(args)
    result: dict[str, Any] = {"bench": None, "ingest": {}, "out": str(args.out)}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stallfree-demo-") as tmp:
        data = args.out / "data" if args.keep_data else Path(tmp)
        if not args.skip_bench:
            _step("1/3 end to end: a simulated accelerator at 80% of stallfree's stand-alone rate, fed by torch's "
                  "DataLoader and by stallfree (ImageNet-sized synthetic JPEGs)")
            bench_args = options("e2e", data / "imagenet-like", synthetic=images, speeds=[],
                                 feeds=["stallfree", "torch"], batches=max(1, images // 64 // 2), warmup=5,
                                 png=args.out / "e2e.png", goals=False, progress=args.progress)
            result["bench"] = e2e.run(bench_args, out)
        _step("2/3 ingest a learnable synthetic dataset (shapes in random colours) into Arrow shards")
        for split, per_class, seed in (("train", 150, 0), ("val", 25, 1)):
            folder = make_image_folder(data / "shapes" / split, num_classes=4, per_class=per_class, size=(48, 48),
                                       seed=seed)
            summary = ingest(folder, data / "shards" / split, workers=1, progress=args.progress)
            result["ingest"][split] = summary
            print(f"{split}: {summary['images']} images into {summary['shards']} shard(s)", file=sys.stderr)
        _step("3/3 train a small CNN in 2 pipeline stages with 1F1B, fed by the Loader over the shards")
        config = demo_config(str(data / "shards" / "train"), str(data / "shards" / "val"), str(args.out / "run"),
                             epochs=epochs, progress=args.progress)
        result["train"] = with_prediction(config, train(config))  # the simulator's bubble beside the measured one
        print(format_summary(result["train"]), file=out)
        accuracy = result["train"].get("eval_top1")
        if accuracy is not None:
            print(f"\neval top-1 {accuracy:.1%} against 25.0% for chance (4 classes)", file=out)
    atomic_write(args.out / "demo.json", (json.dumps(result, indent=1, default=str) + "\n").encode())
    kept = ["e2e.png (the chart)"] if result["bench"] else []
    kept += ["run/ (summary.json, trace.json for https://ui.perfetto.dev, checkpoints)", "demo.json"]
    kept += ["data/ (the generated datasets)"] if args.keep_data else []
    print(f"\nresults in {args.out}: {', '.join(kept)}", file=out)
    emit(args, result)
    return 0
