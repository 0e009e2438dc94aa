"""The training job's configuration: ``TrainConfig``, checked when built.

It lives apart from the trainer so that reading it (``stallfree train --help``, the argument checks) does not
import torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from stallfree.core.accelerator import SimAccelerator, parse_accelerator
from stallfree.stage_runtime.link_delay import LinkDelay, parse_link_delay
from stallfree.stage_runtime.schedules import ScheduleSpec, schedule_spec

__all__ = ["BUNDLED_MODELS", "LR_SCHEDULES", "MAX_TIMEOUT_S", "OPTIMIZERS", "VERIFY_MODES", "LrSchedule", "Optimizer",
           "TrainConfig", "Verify", "flag"]

# The names of stallfree.stage_runtime.models.zoo.MODELS, listed here because that module needs torch to define
# them; tests/cli/test_imports.py keeps the two equal.
BUNDLED_MODELS = ("mlp", "small_cnn", "resnet_cifar", "resnet18", "resnet50", "vit_small")

# Loader(verify=)'s modes, stallfree.pipeline.shards.Verify, spelled here because importing stallfree.pipeline
# imports DALI, which `stallfree train --help` must not; tests/cli/test_imports.py keeps the two equal.
Verify = Literal["first-use", "open", "none"]
VERIFY_MODES: tuple[str, ...] = get_args(Verify)
# --optimizer and --lr-schedule (stallfree.stage_runtime.train.optim builds them)
Optimizer = Literal["sgd", "adamw"]
LrSchedule = Literal["constant", "cosine"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
LR_SCHEDULES: tuple[str, ...] = get_args(LrSchedule)


MAX_TIMEOUT_S = 7 * 24 * 3600  # --timeout's largest: beyond it, datetime and the backends' clocks overflow
# The fields whose flag is not ``--`` + the name with dashes (stallfree.commands.train), or that have none.
_FLAGS = {"timeout_s": "--timeout", "num_classes": "--classes", "samples": "--synthetic", "out_dir": "--out",
          "eval_data": "--eval", "keep_checkpoints": "keep_checkpoints", "log_every": "log_every"}


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training job needs; ``stallfree train`` builds it from its flags."""

    model: str = "small_cnn"  # a bundled name (stallfree.stage_runtime.models.zoo.MODELS) or package.module:factory
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    data: str | None = None  # training ImageFolder / file list / shard folder; None: generated tensors
    eval_data: str | None = None  # held-out split, evaluated each epoch (top-1); None with data=None: generated
    image_size: int = 32
    num_classes: int | None = None  # default: the Loader's class count (10 for generated tensors)
    samples: int = 2048  # generated tensors only: training samples
    feed: str = "stallfree"  # "stallfree" (the Loader) or "torch" (torch's DataLoader, for comparison)
    loader_threads: int | None = None  # Loader threads / DataLoader workers (default: the Loader's / 2)
    verify: Verify = "first-use"  # when the Loader hashes a shard: "first-use", "open" or "none" (Loader(verify=))
    plan_prediction: dict[str, Any] | None = None  # from --plan: step_s, images_per_s, bubble, plan (the file)
    # "sim:R" (the string is parsed here, once, into the SimAccelerator this field then holds) or a SimAccelerator:
    # each stage waits as a device training R img/s per replica would. None: the real device.
    accelerator: SimAccelerator | None = None
    # "0-1:20" (or several, comma-separated or a list; parsed here, once, into the LinkDelay this field then holds):
    # every message the schedule sends between pipeline ranks 0 and 1 arrives 20 ms late (stage_runtime/link_delay.py)
    link_delay: LinkDelay | None = None
    stages: int = 2  # pipeline ranks (processes) per replica
    schedule: str = "1f1b"
    virtual_stages: int = 2  # stages per rank for interleaved-1f1b and zero-bubble
    microbatches: int = 4
    balance: tuple[int, ...] | None = None  # layers per model stage; None: measured
    dp: int = 1  # data-parallel pipeline replicas
    batch_size: int = 32  # per replica and step, split into `microbatches`
    epochs: int = 1
    max_steps: int | None = None  # stop after this many steps in all
    # the training augmentation: a torchvision-style spec ("RandomResizedCrop(32), RandomHorizontalFlip()") or
    # package.module:factory (stallfree.stage_runtime.train.augment); None: augment.DEFAULT at image_size
    transform: str | None = None
    optimizer: Optimizer = "sgd"  # or "adamw" (torch's betas and eps)
    lr: float = 0.01  # the peak rate, after any warm-up
    momentum: float = 0.9  # SGD only
    weight_decay: float = 0.0
    lr_schedule: LrSchedule = "constant"  # or "cosine": from lr after the warm-up towards 0 at the last step
    warmup_steps: int = 0  # steps of linear warm-up to lr (stallfree.stage_runtime.train.optim)
    seed: int = 0
    device: str = "cpu"  # "cuda" gives rank r the GPU LOCAL_RANK and NCCL
    threads: int | None = None  # torch threads per process (default: cores / processes)
    out_dir: str = "stallfree-train"  # train.jsonl, summary.json, trace.json
    checkpoint_dir: str | None = None  # default: out_dir/checkpoints
    checkpoint_every: int = 0  # steps; 0: only at the end
    keep_checkpoints: int = 2
    resume: bool = False  # continue from checkpoint_dir's latest.json
    progress: bool = True
    log_every: int = 1
    timeout_s: float = 300.0  # a collective that waits longer fails the job instead of hanging it

    def __post_init__(self) -> None:
        schedule_spec(self.schedule)  # an unknown name fails first, listing the known ones
        for name in ("stages", "microbatches", "dp", "batch_size", "epochs", "image_size", "log_every",
                     "keep_checkpoints", "max_steps", "threads", "num_classes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                hint = " (leave it out to run every epoch)" if name == "max_steps" else ""
                raise ValueError(f"{flag(name)} must be >= 1, got {value}{hint}")
        for name in ("checkpoint_every", "loader_threads"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.data is None and self.samples < self.batch_size * self.dp:
            raise ValueError(f"--synthetic {self.samples} is less than one batch per replica (--batch-size "
                             f"{self.batch_size} x --dp {self.dp}); generate at least {self.batch_size * self.dp}")
        if not (math.isfinite(self.timeout_s) and 1 <= self.timeout_s <= MAX_TIMEOUT_S):
            raise ValueError(f"--timeout must be a number of seconds from 1 to {MAX_TIMEOUT_S} (a week), got "
                             f"{self.timeout_s:g}")
        if self.batch_size % self.microbatches:
            raise ValueError(f"batch_size must divide into micro-batches: batch_size={self.batch_size}, "
                             f"microbatches={self.microbatches}; use a multiple of {self.microbatches}")
        self.spec.check(self.stages, self.microbatches)
        if self.feed not in ("stallfree", "torch"):
            raise ValueError(f"feed must be 'stallfree' or 'torch', got {self.feed!r}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):  # inf trains to NaN, nan is NaN from the start
            raise ValueError(f"--lr must be a finite number > 0, got {self.lr}")
        for name in ("weight_decay", "momentum", "warmup_steps"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{flag(name)} must be a finite number >= 0, got {getattr(self, name)}")
        if self.transform is not None and (self.data is None or self.feed == "torch"):
            what = "--synthetic generates tensors" if self.data is None else "--feed torch uses the baseline's own"
            raise ValueError(f"transform applies to the Loader's images of a dataset, but {what}: drop --transform "
                             "or give a dataset fed by stallfree")
        # the one place the string is parsed: the CLI, a Python user and a summary's JSON form all enter here
        object.__setattr__(self, "accelerator", parse_accelerator(self.accelerator))
        object.__setattr__(self, "link_delay", parse_link_delay(self.link_delay))
        if self.link_delay is not None:
            if not self.spec.flush:
                raise ValueError(f"--link-delay is not run under --schedule {self.schedule}: its runner sends its own "
                                 "messages, which the delay does not hold (and the summary's prediction does not "
                                 "model it); use --schedule 1f1b, its order with a flush, or drop --link-delay")
            slowest = max(s for _, _, s in self.link_delay.pairs)
            if slowest >= self.timeout_s:
                raise ValueError(f"--link-delay {self.link_delay} holds a message {slowest:g} s, as long as --timeout "
                                 f"{self.timeout_s:g} s lets a collective wait; give a shorter delay or a longer "
                                 "--timeout")
            owner = [self.spec.owner(s, self.stages) for s in range(self.model_stages)]
            self.link_delay.check(self.stages, [(a, b) for a, b in zip(owner, owner[1:], strict=False) if a != b],
                                  f"{self.schedule} with {self.stages} pipeline ranks")

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values (``accelerator``, ``link_delay`` as strings); ``TrainConfig(**it)`` rebuilds it."""
        return {**asdict(self), "accelerator": None if self.accelerator is None else str(self.accelerator),
                "link_delay": None if self.link_delay is None else str(self.link_delay)}

    def total_steps(self, steps_per_epoch: int) -> int:
        """Optimizer steps the run takes: every epoch's, or ``max_steps`` if fewer."""
        every = self.epochs * steps_per_epoch
        return every if self.max_steps is None else min(self.max_steps, every)

    @property
    def spec(self) -> ScheduleSpec:
        """The schedule's entry in the table: its torch class, placement, rules and bubble theory."""
        return schedule_spec(self.schedule)

    @property
    def model_stages(self) -> int:
        """How many pieces the model is cut into: pipeline ranks x stages per rank."""
        return self.stages * self.spec.stages_per_rank(self.virtual_stages)

    @property
    def world_size(self) -> int:
        """All processes: pipeline ranks x replicas."""
        return self.stages * self.dp

    @property
    def ckpt_root(self) -> Path:
        """Where checkpoints go."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.out_dir) / "checkpoints"


def flag(name: str) -> str:
    """The ``stallfree train`` flag that sets the :class:`TrainConfig` field ``name``, for messages."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))
