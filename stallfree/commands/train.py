"""``stallfree train``: train a model split into pipeline stages, fed by the Loader, with the stall report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stallfree.commands.output import add_json_arguments, add_progress_argument, emit, human, require_writable
from stallfree.stage_runtime.config.train_config import (
    BALANCE_BATCHES,
    BUNDLED_MODELS,
    DEFAULT_PATCH,
    DEFAULT_SEQ_LEN,
    LR_SCHEDULES,
    OPTIMIZERS,
    TRAIN_ON,
    VERIFY_MODES,
    TrainConfig,
)
from stallfree.stage_runtime.plan.handoff import train_settings
from stallfree.stage_runtime.processes import torchrun_env
from stallfree.stage_runtime.schedules import SCHEDULES
from stallfree.stage_runtime.train.report import format_summary

__all__ = ["register"]

EXAMPLES = """examples:
  stallfree train ./data/train --eval ./data/val --model resnet_cifar --stages 2 --schedule 1f1b --microbatches 4
  stallfree train ./data/train --model small_cnn --balance 3,4 --checkpoint-every 100 --out ./run
  stallfree train ./data/train --out ./run --resume            # continue exactly from ./run/checkpoints
  stallfree train --synthetic 4096 --model mlp --schedule interleaved-1f1b --stages 2 --microbatches 8
  stallfree train ./data/train --accelerator sim:1000 --feed torch   # would a 1,000 img/s device wait for data?
  stallfree train ./data/train --model mypkg.nets:resnet --transform "RandomResizedCrop(32), RandomHorizontalFlip(), \\
      Normalize()" --optimizer adamw --lr 1e-3 --weight-decay 0.05 --lr-schedule cosine --warmup-steps 100
  stallfree train --synthetic 512 --accelerator sim:400 --stages 2 --link-delay 0-1:20   # a slow cut, run for real
  stallfree train ./shards/train --verify none          # trust the shards: no SHA-256 read before the batches
  stallfree train ./data/train --no-progress --json | jq .images_per_s   # the summary alone on stdout
  stallfree train --synthetic 256 --model gpt_tiny --seq-len 64 --stages 2 --batch-size 8 --optimizer adamw \\
      --lr 3e-3                        # a small transformer on generated packed sequences, attention within documents
  stallfree train ./tokens --model gpt_tiny --seq-len 256 --dp 2          # a token source packed by the Loader
  stallfree train --synthetic 512 --model vlm_tiny --seq-len 64 --image-size 32 --patch 8 --optimizer adamw \
      --lr 3e-3                      # a vision stem + transformer on the generated caption task (image-text packs)
  stallfree train ./shards/captions --model vlm_tiny --seq-len 128 --image-size 32   # image-text shards
  stallfree train ./tokens --model gpt_tiny --seq-len 256 --dp 4 --accelerator sim:20000 \\
      --balance-batches compute       # packs evened by compute across replicas and micro-batches, on a 20k tok/s device
  torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint host:29500 -m stallfree.cli train ./data/train \\
      --stages 4 --dp 2 --device cuda                          # the same command across machines
"""


def _balance(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--balance wants layer counts like 3,5,4, got {text!r}") from None
    return values


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stallfree train``."""
    d = TrainConfig().flags()  # each flag's default, from the part that holds it
    p = sub.add_parser(
        "train",
        help="train a model split into pipeline stages, fed by the Loader",
        description="Split a model into pipeline stages (balanced by measured time and memory, or --balance), "
        "spawn one process per stage, feed stage 0 from the Loader, and report throughput, the input-stall "
        "fraction and the pipeline bubble beside the schedule's theory. Writes train.jsonl, summary.json, "
        "trace.json (Perfetto) and checkpoints under --out.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", nargs="?", help="training data: ImageFolder, CSV/Parquet file list or shard folder (a "
                   "token model's: a token source the Loader packs, e.g. ingested token shards)")
    p.add_argument("--eval", dest="eval_data", help="held-out split, evaluated each epoch (top-1)")
    p.add_argument("--synthetic", type=int, metavar="N", help="no dataset: N generated learnable samples (a token "
                   "model's: N packed sequences of generated documents)")
    p.add_argument("--plan", type=Path, metavar="PLAN_JSON",
                   help="run the best configuration of `stallfree plan`'s plan.json: its model, image size, schedule, "
                   "stages, virtual stages, micro-batches, balance and batch size (a flag that disagrees is an error)")
    p.add_argument("--model", default=d["model"], help=f"{', '.join(BUNDLED_MODELS)} or package.module:factory "
                   f"(default {d['model']})")
    p.add_argument("--image-size", type=int, default=d["image_size"], help="side of the square images the model takes")
    p.add_argument("--classes", dest="num_classes", type=int, help="default: the dataset's class count")
    p.add_argument("--seq-len", type=int, metavar="S", help=f"a token model's (gpt_tiny) packed length: tokens per "
                   f"row of a batch (default {DEFAULT_SEQ_LEN})")
    p.add_argument("--vocab-size", type=int, metavar="V", help="a token model's vocabulary (default: the token "
                   "source's; 32 for --synthetic)")
    p.add_argument("--attention-span", type=int, metavar="TOKENS", help="a token model's cost of a document of l "
                   "tokens is l + l^2 / TOKENS (stallfree.Cost.attention): attention is as costly as the linear part "
                   "for a document of TOKENS tokens; what --accelerator sim:R charges and --balance-batches compute "
                   "evens (default: --seq-len)")
    p.add_argument("--patch", type=int, metavar="P", help=f"a vision model's (vlm_tiny) patch side: its images are "
                   f"resized to --image-size square and each is (image-size / P)^2 tokens of its rows (default "
                   f"{DEFAULT_PATCH})")
    p.add_argument("--train-on", choices=TRAIN_ON, default=d["train_on"],
                   help="a vision model's image-text source: which text tokens are targets, all (default) or a "
                   "conversation's assistant replies (stallfree.Packing(train_on=); the prompt's and user turns' "
                   "labels are then -100)")
    p.add_argument("--stages", type=int, default=d["stages"], help="pipeline ranks (processes) per replica")
    p.add_argument("--schedule", choices=SCHEDULES, default=d["schedule"], help="pipeline schedule")
    p.add_argument("--virtual-stages", type=int, default=d["virtual_stages"],
                   help="stages per rank for interleaved-1f1b and zero-bubble")
    p.add_argument("--microbatches", type=int, default=d["microbatches"],
                   help="micro-batches each step's batch is split into (they must divide --batch-size)")
    p.add_argument("--balance", type=_balance, help="layers per model stage, e.g. 3,5,4 (default: measured)")
    p.add_argument("--dp", type=int, default=d["dp"], help="data-parallel pipeline replicas")
    p.add_argument("--batch-size", type=int, default=d["batch_size"], help="per replica and step")
    p.add_argument("--epochs", type=int, default=d["epochs"], help="passes over the training data")
    p.add_argument("--max-steps", type=int, help="stop after this many steps in all (default: run every epoch)")
    p.add_argument("--transform", metavar="SPEC",
                   help="the training augmentation: torchvision-style steps, e.g. \"RandomResizedCrop(32, scale=(0.5, "
                   "1.0)), RandomHorizontalFlip(), Normalize()\", or package.module:factory returning a transform "
                   "(stallfree's or torchvision's); it must end at --image-size (default: RandomResizedCrop("
                   "image-size), RandomHorizontalFlip(), Normalize(ImageNet mean and std))")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=d["optimizer"],
                   help="sgd (with --momentum) or adamw (torch's betas 0.9, 0.999 and eps 1e-8)")
    p.add_argument("--lr", type=float, default=d["lr"], help="the learning rate (the peak, after any warm-up)")
    p.add_argument("--momentum", type=float, default=d["momentum"], help="SGD's momentum (sgd only)")
    p.add_argument("--weight-decay", type=float, default=d["weight_decay"],
                   help="weight decay (AdamW's decoupled decay with adamw)")
    p.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=d["lr_schedule"],
                   help="constant, or cosine: from --lr after the warm-up down towards 0 at the last step")
    p.add_argument("--warmup-steps", type=int, default=d["warmup_steps"],
                   help="steps of linear warm-up from --lr / N to --lr before the schedule")
    p.add_argument("--seed", type=int, default=d["seed"], help="seeds the model, the data order and augmentation")
    p.add_argument("--device", default=d["device"], help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    p.add_argument("--threads", type=int, help="torch threads per process (default: cores / processes)")
    p.add_argument("--feed", choices=("stallfree", "torch"), default=d["feed"],
                   help="what feeds stage 0: stallfree's Loader or torch's DataLoader (the baseline, ImageFolder "
                   "only)")
    p.add_argument("--loader-threads", type=int,
                   help="Loader threads or DataLoader workers (default: the Loader's own / 2 workers)")
    p.add_argument("--verify", choices=VERIFY_MODES, default=d["verify"],
                   help="when the Loader checks an ingested shard's SHA-256 against the manifest: first-use (on its "
                   "first read), open (every shard before training) or none (never); a shard that matched once and is "
                   f"unchanged since is not hashed again (default {d['verify']})")
    p.add_argument("--accelerator", metavar="sim:R",
                   help="simulate a device that trains R img/s per replica: each stage waits the device's time "
                   "instead of computing, holding no CPU (throughput then measures the input path and the "
                   "pipeline, not the model). For a token model R is tokens/s of linear work: a micro-batch holding "
                   "documents of lengths l_i (each segment with document_index >= 0; a split piece counts at its own "
                   "length) and p padding slots takes (sum l_i + sum l_i^2 / A + p) / R seconds on the slowest model "
                   "stage, A being --attention-span (attention within documents; every slot, padding too, pays the "
                   "linear part), and each other stage its measured share of that")
    # not argparse's choices: a bad value is refused in one line naming the flag (FeedConfig), not after the usage
    p.add_argument("--balance-batches", metavar="{" + ",".join(BALANCE_BATCHES) + "}", default=d["balance_batches"],
                   help="a token source's packs for each step, over the --dp replicas x --microbatches micro-batches: "
                   "none (plain packing), tokens (even token counts) or compute (even cost, l + l^2 / "
                   "--attention-span per document), so that no replica waits for another at the all-reduce "
                   "(stallfree.Packing(balance=); the books' data-parallel imbalance part shows what is left)")
    p.add_argument("--link-delay", action="append", metavar="RANKS:MS",
                   help="a slow link: every message the schedule sends between two pipeline ranks arrives MS ms "
                   "after it was sent, while its sender goes on computing (a cross-site latency), e.g. 0-1:20; "
                   "comma-separated or repeated for several pairs; one machine only; stallfree plan --cross-link "
                   "and the summary's prediction model the same (docs/plan.md, \"A slow link\")")
    p.add_argument("--out", dest="out_dir", default=d["out_dir"], help=f"run folder (default {d['out_dir']})")
    p.add_argument("--checkpoint-dir", help="default: OUT/checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=d["checkpoint_every"], help="steps; 0: at the end only")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    p.add_argument("--timeout", dest="timeout_s", type=float, default=d["timeout_s"],
                   help="seconds a collective may wait before the job fails instead of hanging")
    add_json_arguments(p)
    add_progress_argument(p)
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    require_writable(args.out_dir, "--out")  # before torch loads: a read-only current folder, the default's home
    # They import torch: `stallfree --help` builds this module's parser without it.
    from stallfree.stage_runtime.jobs import train, with_prediction
    from stallfree.stage_runtime.train import checkpoint as checkpoint
    from stallfree.stage_runtime.train.launcher import StageFailure

    if (args.data is None) == (args.synthetic is None):
        raise ValueError("give a dataset folder or --synthetic N (not both)")
    defaults = TrainConfig().flags()
    values = {k: v for k, v in vars(args).items() if k in defaults and v is not None}
    if args.synthetic is not None:
        values["samples"] = args.synthetic
    if args.plan is not None:
        values = _with_plan(values, args.plan, d=defaults)
    config = TrainConfig.from_flags(**values)  # the flags, parsed once into the job's parts
    try:
        summary = train(config)
    except StageFailure as err:
        step = checkpoint.latest(config.ckpt_root)
        kept = (f"no checkpoint was written under {config.ckpt_root}" if step is None else
                f"the last checkpoint, step {step} under {config.ckpt_root}, is intact (--resume continues it)")
        if err.cause.startswith(f"{checkpoint.CheckpointWriteError.__name__}:"):  # it says what was kept
            kept = "--resume continues from it once the checkpoint folder can take the next one"
        print(f"stallfree train: error: {err}; {kept}", file=sys.stderr)
        return 1
    if not summary or not _reports():  # under torchrun only rank 0 holds and prints it
        return 0
    print(format_summary(with_prediction(config, summary)), file=human(args), flush=True)
    emit(args, summary)
    return 0


def _with_plan(values: dict[str, Any], plan: Path, d: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the plan's settings; a flag given with another value than the plan's is refused."""
    settings = train_settings(plan)
    for key, value in settings.items():
        given = values.get(key, d.get(key))
        if key in values and given != d.get(key) and given != value:
            shown = ",".join(map(str, given)) if isinstance(given, tuple) else given
            raise ValueError(f"--{key.replace('_', '-')} {shown} disagrees with {plan}'s {value}: drop the flag "
                             "or the --plan")
    return {**values, **settings}


def _reports() -> bool:
    """Whether this process prints the summary: always, except under torchrun, where global rank 0 does."""
    env = torchrun_env()
    return env is None or env[0] == 0
