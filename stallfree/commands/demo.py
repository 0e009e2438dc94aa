"""``stallfree demo``: the built-in synthetic dataset, the Loader over it, and torch's DataLoader beside it."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stallfree demo``."""
    parser = sub.add_parser(
        "demo",
        help="run stallfree on a built-in synthetic dataset",
        description="Write a small synthetic labelled JPEG dataset (shapes in random colours), then load it with "
        "stallfree's Loader and with torch's DataLoader and print both throughputs.",
        epilog="examples:\n  stallfree demo\n  stallfree demo --out ./demo-data --images 2000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, help="where to write the dataset (default: a temporary folder)")
    parser.add_argument("--images", type=int, default=640, help="how many JPEGs to write (default 640)")
    parser.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from stallfree.bench import loader as bench

    if args.images < 64:
        raise ValueError(f"--images must be at least one batch of 64, got {args.images}")
    with tempfile.TemporaryDirectory(prefix="stallfree-demo-") as tmp:
        data = (args.out or Path(tmp)) / "train"
        bench_args = argparse.Namespace(
            data=data, synthetic=args.images, batch_size=64, batches=max(1, args.images // 64 // 2), repeats=3,
            threads=len(os.sched_getaffinity(0)), only=["stallfree", "torch"], json=None, device="cpu",
        )
        return bench.run(bench_args)
