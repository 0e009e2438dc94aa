"""The parts of a training job's configuration, each frozen and checking its own fields when built.

A part holds what one concern of the job needs (the model, what feeds stage 0, the pipeline's shape, the optimizer,
how long it trains, the stage processes, the checkpoints, the report, the simulated hardware); a new option is one
field in one part, checked there. What ties two parts together is checked by ``TrainConfig``
(:mod:`.train_config`). A field's flat keyword (``stallfree train``'s flag without its dashes, and the key
``summary.json`` keeps it under) is its name, or the part's ``FLAT`` entry for it. This module imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from stallfree.core.accelerator import SimAccelerator, parse_accelerator
from stallfree.stage_runtime.link_delay import LinkDelay, parse_link_delay
from stallfree.stage_runtime.schedules import ScheduleSpec, schedule_spec

if TYPE_CHECKING:
    from stallfree.core.cost import Cost

__all__ = ["BALANCE_BATCHES", "BUNDLED_MODELS", "DEFAULT_PATCH", "DEFAULT_SEQ_LEN", "LR_SCHEDULES", "MAX_TIMEOUT_S",
           "OPTIMIZERS", "TEXT_MODELS", "TOKEN_MODELS", "TRAIN_ON", "VERIFY_MODES", "VISION_MODELS", "BalanceBatches",
           "CheckpointConfig", "FeedConfig", "LrSchedule", "ModelConfig", "Optimizer", "OptimizerConfig",
           "PipelineConfig", "ProcessConfig", "ReportConfig", "SimulationConfig", "StepsConfig", "TrainOn", "Verify",
           "flag"]

# The names of stallfree.stage_runtime.models.zoo.MODELS, listed here because that module needs torch to define
# them; tests/cli/test_imports.py keeps the two equal.
BUNDLED_MODELS = ("mlp", "small_cnn", "resnet_cifar", "resnet18", "resnet50", "vit_small", "gpt_tiny", "vlm_tiny")
# The bundled models that take packed token sequences (stallfree.stage_runtime.models.gpt): a job of one is a token job.
# Those with a vision stem (stallfree.stage_runtime.models.vision) are fed packed image-text sequences.
TEXT_MODELS, VISION_MODELS = ("gpt_tiny",), ("vlm_tiny",)
TOKEN_MODELS = TEXT_MODELS + VISION_MODELS
DEFAULT_PATCH = 8  # --patch of a vision model when not given
DEFAULT_SEQ_LEN = 256  # --seq-len of a token job when not given

# Loader(verify=)'s modes, stallfree.pipeline.shards.Verify, spelled here because importing stallfree.pipeline
# imports DALI, which `stallfree train --help` must not; tests/cli/test_imports.py keeps the two equal.
Verify = Literal["first-use", "open", "none"]
VERIFY_MODES: tuple[str, ...] = get_args(Verify)
# --optimizer and --lr-schedule (stallfree.stage_runtime.train.optim builds them)
Optimizer = Literal["sgd", "adamw"]
LrSchedule = Literal["constant", "cosine"]
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
LR_SCHEDULES: tuple[str, ...] = get_args(LrSchedule)
# --train-on: Packing(train_on=) of a vision job's Loader: every text token a target, or the assistant's replies only
TrainOn = Literal["all", "assistant"]
TRAIN_ON: tuple[str, ...] = get_args(TrainOn)
# --balance-batches: Packing(balance=) of a token job's Loader ("none": Packing's balance=None, plain packing)
BalanceBatches = Literal["none", "tokens", "compute"]
BALANCE_BATCHES: tuple[str, ...] = get_args(BalanceBatches)

MAX_TIMEOUT_S = 7 * 24 * 3600  # --timeout's largest: beyond it, datetime and the backends' clocks overflow
# The flat keywords whose flag is not ``--`` + the keyword with dashes (stallfree.commands.train), or that have none.
_FLAGS = {"timeout_s": "--timeout", "num_classes": "--classes", "samples": "--synthetic", "out_dir": "--out",
          "eval_data": "--eval", "keep_checkpoints": "keep_checkpoints", "log_every": "log_every"}


def flag(name: str) -> str:
    """The ``stallfree train`` flag that sets the flat keyword ``name``, for messages."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def _at_least(low: int, **values: int | None) -> None:
    """Refuse a value under ``low`` (``None``: not given), naming its flag."""
    for name, value in values.items():
        if value is not None and value < low:
            hint = " (leave it out to run every epoch)" if name == "max_steps" else ""
            raise ValueError(f"{flag(name)} must be >= {low}, got {value}{hint}")


@dataclass(frozen=True)
class ModelConfig:
    """The model: a bundled name (``stallfree.stage_runtime.models.zoo.MODELS``) or ``package.module:factory``."""

    FLAT: ClassVar[dict[str, str]] = {"name": "model", "kwargs": "model_kwargs"}

    name: str = "small_cnn"
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to the factory
    image_size: int = 32  # the side of the square images it takes
    num_classes: int | None = None  # default: the Loader's class count (10 for generated tensors)
    # A token model's (TOKEN_MODELS): the packed length of its rows (default DEFAULT_SEQ_LEN), and its vocabulary
    # (default: the token source's; 32 for generated sequences)
    seq_len: int | None = None
    vocab_size: int | None = None
    # A token model's cost of a document of l tokens, l + l^2 / attention_span (stallfree.Cost.attention): what the
    # simulated device charges and --balance-batches compute evens; default: the packed length (attention over a full
    # row as costly as the linear part)
    attention_span: int | None = None
    # A vision model's (VISION_MODELS) patch side: its images are image_size square, each (image_size / patch)**2
    # tokens of its packed rows (default DEFAULT_PATCH)
    patch: int | None = None

    def __post_init__(self) -> None:
        _at_least(1, image_size=self.image_size, num_classes=self.num_classes, attention_span=self.attention_span,
                  patch=self.patch)
        _at_least(2, seq_len=self.seq_len, vocab_size=self.vocab_size)
        if self.patch is not None and self.name not in VISION_MODELS:
            raise ValueError(f"--patch applies to a vision model ({', '.join(VISION_MODELS)}), not to {self.name}: "
                             f"drop it or choose --model {VISION_MODELS[0]}")
        if self.vision is not None:
            self._check_vision(self.vision)
        tokens = self.name in TOKEN_MODELS
        given = [f for f, v in (("seq_len", self.seq_len), ("vocab_size", self.vocab_size),
                                ("attention_span", self.attention_span)) if v is not None]
        if not tokens and given:
            raise ValueError(f"{flag(given[0])} applies to a token model ({', '.join(TEXT_MODELS)}), not to "
                             f"{self.name}: drop it or choose --model {TOKEN_MODELS[0]}")
        if tokens and self.num_classes is not None:
            raise ValueError(f"{flag('num_classes')} counts an image model's classes; {self.name}'s outputs are its "
                             "vocabulary: give --vocab-size")

    def _check_vision(self, patch: int) -> None:
        if self.image_size % patch:
            raise ValueError(f"--image-size {self.image_size} must be a multiple of --patch {patch} (images are cut "
                             "into patches of that side)")
        if self.image_tokens >= self.packed_len:
            raise ValueError(f"an image of --image-size {self.image_size} is {self.image_tokens} tokens (patches of "
                             f"{patch}), which leaves no room for text in a row of --seq-len {self.packed_len}: give "
                             "a longer --seq-len, a smaller --image-size or a larger --patch")

    @property
    def vision(self) -> int | None:
        """A vision model's patch side (``patch``, or :data:`DEFAULT_PATCH`); ``None`` for every other model."""
        return (self.patch or DEFAULT_PATCH) if self.name in VISION_MODELS else None

    @property
    def image_tokens(self) -> int:
        """A vision model's tokens per image, ``(image_size / patch)**2`` (meaningless for the others)."""
        return (self.image_size // (self.vision or DEFAULT_PATCH)) ** 2

    @property
    def kind(self) -> Literal["images", "tokens"]:
        """What a sample is: an image (and a label), or a packed token sequence (a token model)."""
        return "tokens" if self.name in TOKEN_MODELS else "images"

    @property
    def packed_len(self) -> int:
        """A token model's packed length: ``seq_len``, or :data:`DEFAULT_SEQ_LEN` (meaningless for images)."""
        return self.seq_len or DEFAULT_SEQ_LEN

    @property
    def cost(self) -> Cost:
        """A token model's cost of a document: ``Cost.attention(attention_span or packed_len)``, in tokens."""
        from stallfree.core.cost import Cost  # NumPy: `stallfree --help` builds these parts without importing it

        return Cost.attention(self.attention_span or self.packed_len)

    def factory_kwargs(self) -> dict[str, Any]:
        """What the factory gets besides the classes and image size: ``kwargs`` (and a token model's packed length)."""
        if self.vision is not None:
            return {**self.kwargs, "seq_len": self.packed_len, "patch": self.vision}
        return {**self.kwargs, "seq_len": self.packed_len} if self.kind == "tokens" else dict(self.kwargs)


@dataclass(frozen=True)
class FeedConfig:
    """What feeds stage 0: a dataset read by the Loader or torch's DataLoader, or generated tensors."""

    FLAT: ClassVar[dict[str, str]] = {"kind": "feed"}

    data: str | None = None  # training ImageFolder / file list / shard folder; None: generated tensors
    eval_data: str | None = None  # held-out split, evaluated each epoch (top-1); None with data=None: generated
    samples: int = 2048  # generated tensors only: training samples
    kind: str = "stallfree"  # "stallfree" (the Loader) or "torch" (torch's DataLoader, for comparison)
    loader_threads: int | None = None  # Loader threads / DataLoader workers (default: the Loader's / 2)
    verify: Verify = "first-use"  # when the Loader hashes a shard: "first-use", "open" or "none" (Loader(verify=))
    # the training augmentation: a torchvision-style spec ("RandomResizedCrop(32), RandomHorizontalFlip()") or
    # package.module:factory (stallfree.stage_runtime.train.augment); None: augment.DEFAULT at the image size
    transform: str | None = None
    # a token source's packs balanced across the replicas and micro-batches of each step (Packing(balance=)): "none",
    # "tokens" or "compute" (by the model's cost, ModelConfig.cost)
    balance_batches: BalanceBatches = "none"
    # an image-text source's labels (Packing(train_on=)): "all" text tokens, or "assistant": a conversation's replies
    train_on: TrainOn = "all"

    def __post_init__(self) -> None:
        if self.train_on not in TRAIN_ON:
            raise ValueError(f"--train-on must be one of {', '.join(TRAIN_ON)}, got {self.train_on!r}")
        if self.balance_batches not in BALANCE_BATCHES:
            raise ValueError(f"--balance-batches must be one of {', '.join(BALANCE_BATCHES)}, got "
                             f"{self.balance_batches!r}")
        if (self.loader_threads or 0) < 0:
            raise ValueError(f"{flag('loader_threads')} must be >= 0, got {self.loader_threads}")
        if self.kind not in ("stallfree", "torch"):
            raise ValueError(f"feed must be 'stallfree' or 'torch', got {self.kind!r}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        if self.transform is not None and (self.data is None or self.kind == "torch"):
            what = "--synthetic generates tensors" if self.data is None else "--feed torch uses the baseline's own"
            raise ValueError(f"transform applies to the Loader's images of a dataset, but {what}: drop --transform "
                             "or give a dataset fed by stallfree")


@dataclass(frozen=True)
class PipelineConfig:
    """The pipeline's shape: its schedule, ranks, micro-batches, split and replicas, and the batch they share."""

    FLAT: ClassVar[dict[str, str]] = {}

    schedule: str = "1f1b"
    stages: int = 2  # pipeline ranks (processes) per replica
    virtual_stages: int = 2  # stages per rank for interleaved-1f1b and zero-bubble
    microbatches: int = 4
    balance: tuple[int, ...] | None = None  # layers per model stage; None: measured
    dp: int = 1  # data-parallel pipeline replicas
    batch_size: int = 32  # per replica and step, split into `microbatches`

    def __post_init__(self) -> None:
        schedule_spec(self.schedule)  # an unknown name fails first, listing the known ones
        _at_least(1, stages=self.stages, microbatches=self.microbatches, dp=self.dp, batch_size=self.batch_size)
        if self.batch_size % self.microbatches:
            raise ValueError(f"batch_size must divide into micro-batches: batch_size={self.batch_size}, "
                             f"microbatches={self.microbatches}; use a multiple of {self.microbatches}")
        self.spec.check(self.stages, self.microbatches)

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
    def micro_batch(self) -> int:
        """Images per micro-batch."""
        return self.batch_size // self.microbatches

    def owner(self, stage: int) -> int:
        """The pipeline rank that runs model stage ``stage``."""
        return self.spec.owner(stage, self.stages)


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer and its learning-rate schedule (:mod:`stallfree.stage_runtime.train.optim`)."""

    FLAT: ClassVar[dict[str, str]] = {"name": "optimizer"}

    name: Optimizer = "sgd"  # or "adamw" (torch's betas and eps)
    lr: float = 0.01  # the peak rate, after any warm-up
    momentum: float = 0.9  # SGD only
    weight_decay: float = 0.0
    lr_schedule: LrSchedule = "constant"  # or "cosine": from lr after the warm-up towards 0 at the last step
    warmup_steps: int = 0  # steps of linear warm-up to lr

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.name!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):  # inf trains to NaN, nan is NaN from the start
            raise ValueError(f"--lr must be a finite number > 0, got {self.lr}")
        for name in ("weight_decay", "momentum", "warmup_steps"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{flag(name)} must be a finite number >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class StepsConfig:
    """How long the job trains: every epoch, or ``max_steps`` if fewer."""

    FLAT: ClassVar[dict[str, str]] = {}

    epochs: int = 1
    max_steps: int | None = None  # stop after this many steps in all

    def __post_init__(self) -> None:
        _at_least(1, epochs=self.epochs, max_steps=self.max_steps)

    def total(self, steps_per_epoch: int) -> int:
        """Optimizer steps the run takes: every epoch's, or ``max_steps`` if fewer."""
        every = self.epochs * steps_per_epoch
        return every if self.max_steps is None else min(self.max_steps, every)


@dataclass(frozen=True)
class ProcessConfig:
    """The stage processes: their device, torch threads, and how long a collective may wait."""

    FLAT: ClassVar[dict[str, str]] = {}

    device: str = "cpu"  # "cuda" gives rank r the GPU LOCAL_RANK and NCCL
    threads: int | None = None  # torch threads per process (default: cores / processes)
    timeout_s: float = 300.0  # a collective that waits longer fails the job instead of hanging it

    def __post_init__(self) -> None:
        _at_least(1, threads=self.threads)
        if not (math.isfinite(self.timeout_s) and 1 <= self.timeout_s <= MAX_TIMEOUT_S):
            raise ValueError(f"--timeout must be a number of seconds from 1 to {MAX_TIMEOUT_S} (a week), got "
                             f"{self.timeout_s:g}")


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often checkpoints are written, and whether the job resumes from the latest."""

    FLAT: ClassVar[dict[str, str]] = {"dir": "checkpoint_dir", "every": "checkpoint_every", "keep": "keep_checkpoints"}

    dir: str | None = None  # default: the report's out_dir/checkpoints
    every: int = 0  # steps; 0: only at the end
    keep: int = 2
    resume: bool = False  # continue from the folder's latest.json

    def __post_init__(self) -> None:
        _at_least(1, keep_checkpoints=self.keep)
        if self.every < 0:
            raise ValueError(f"{flag('checkpoint_every')} must be >= 0, got {self.every}")


@dataclass(frozen=True)
class ReportConfig:
    """What the job writes and shows: its folder, the progress bar, the rows logged, a plan's prediction beside."""

    FLAT: ClassVar[dict[str, str]] = {}

    out_dir: str = "stallfree-train"  # train.jsonl, summary.json, trace.json
    progress: bool = True
    log_every: int = 1
    plan_prediction: dict[str, Any] | None = None  # from --plan: step_s, images_per_s, bubble, plan (the file)

    def __post_init__(self) -> None:
        _at_least(1, log_every=self.log_every)


@dataclass(frozen=True)
class SimulationConfig:
    """Simulated hardware: a device of ``R`` img/s (``--accelerator sim:R``), slow links (``--link-delay``).

    Each is given as the user's string or its typed value; the string is parsed here, once, into the value the field
    then holds.
    """

    FLAT: ClassVar[dict[str, str]] = {}

    # each stage waits as a device training R img/s per replica would; None: the real device
    accelerator: SimAccelerator | None = None
    # "0-1:20" (or several, comma-separated or a list): every message the schedule sends between pipeline ranks 0
    # and 1 arrives 20 ms late (stallfree.stage_runtime.link_delay)
    link_delay: LinkDelay | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "accelerator", parse_accelerator(self.accelerator))
        object.__setattr__(self, "link_delay", parse_link_delay(self.link_delay))
