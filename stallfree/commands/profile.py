"""``stallfree profile DATA``: measure storage, preparation and compute alone, then together; name the stall."""

from __future__ import annotations

import argparse
from pathlib import Path

from stallfree.commands.kernels import announce_compiles
from stallfree.commands.output import add_json_arguments, add_progress_argument, emit, human, require_writable
from stallfree.core.device import check_device

__all__ = ["register"]

EXAMPLES = """examples:
  stallfree profile ./data/train                         # mlp, batch 64, 224 px; writes ./profile-out/
  stallfree profile ./data/train --model resnet18 --batch-size 128 --device cuda --out prof/
  stallfree profile ./data/train --compare torch         # torch's DataLoader beside stallfree's Loader
  stallfree profile files.csv --image-size 64 --batches 10 --threads 2
  stallfree profile ./data/train --verify                # also run the suggested what-if, predicted vs measured
  stallfree profile ./data/train --json | jq .stalls     # the result alone on stdout, the table on stderr
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
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch")
    parser.add_argument("--image-size", type=int, default=224, help="RandomResizedCrop output side (default 224)")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per run (default 20)")
    parser.add_argument("--threads", type=int, default=None,
                        help="the most preparation threads (default: the cores this process may use)")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch's intra-op threads for the model step (default: torch's own choice); on a CPU "
                        "shared with the loader's threads, fewer can be much faster")
    parser.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    parser.add_argument("--compare", choices=["torch"], help="also run torch's DataLoader (PIL decode) the same way")
    parser.add_argument("--accelerator", metavar="sim:R",
                        help="the step is a simulated device training R img/s (it waits, holding no CPU) instead "
                        "of --model here: would this loader stall a device of that speed?")
    parser.add_argument("--max-side", type=int, default=None,
                        help="the what-if's ingest --max-side (default: image size x 256/224)")
    parser.add_argument("--storage-files", type=int, default=None, help="read at most this many files in phase 1")
    parser.add_argument("--out", type=Path, default=Path("profile-out"), help="output folder (default ./profile-out)")
    parser.add_argument("--verify", nargs="?", const="top", choices=["top", "echo", "max-side", "cores"],
                        help="run a what-if for real (default: the one it suggests first) and print its predicted "
                        "against its measured throughput")
    add_json_arguments(parser)
    add_progress_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Profile ``args.data``, write the three files, print the report; returns the exit code."""
    # They import torch: `stallfree --help` builds this module's parser without it.
    from stallfree.stage_runtime.models.zoo import resolve
    from stallfree.stage_runtime.profile.dataset import profile_dataset
    from stallfree.stage_runtime.profile.phases import MODEL_ALIASES

    # What fails in one line fails before the kernels compile (profile_dataset checks them again, for Python users).
    require_writable(args.out, "--out")  # not after minutes of measuring
    check_device(args.device)
    if args.accelerator is None:
        resolve(MODEL_ALIASES.get(args.model, args.model))
    announce_compiles(args.progress)
    profiled = profile_dataset(args.data, model=args.model, batch_size=args.batch_size, image_size=args.image_size,
                               batches=args.batches, threads=args.threads, torch_threads=args.torch_threads,
                               device=args.device, compare=args.compare, max_side=args.max_side,
                               storage_files=args.storage_files, verify=args.verify, accelerator=args.accelerator,
                               progress=args.progress)
    written = profiled.save(args.out)
    out = human(args)
    print(profiled.table(), file=out)
    print(f"wrote {written[0]}, {written[1]} (https://ui.perfetto.dev), {written[2]}", file=out)
    emit(args, profiled.to_dict())
    return 0
