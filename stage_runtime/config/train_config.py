"""The training job's configuration: ``TrainConfig``, its parts, and the flat keywords that build them.

A job is its parts (:mod:`.parts`), each checked when built, and the seed of its draws; ``TrainConfig`` checks what
ties two parts together. ``stallfree train``'s flags are flat (``--lr``, ``--stages``), and so is the ``config``
that ``summary.json`` keeps: :meth:`TrainConfig.from_flags` routes each flat keyword to its part, once, where the
values enter, and :meth:`TrainConfig.to_json` gives them back. It lives apart from the trainer so that reading it
(``stallfree train --help``, the argument checks) does not import torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast

from .parts import (
    BALANCE_BATCHES,
    BUNDLED_MODELS,
    DEFAULT_PATCH,
    DEFAULT_SEQ_LEN,
    LR_SCHEDULES,
    MAX_TIMEOUT_S,
    OPTIMIZERS,
    TEXT_MODELS,
    TOKEN_MODELS,
    TRAIN_ON,
    VERIFY_MODES,
    VISION_MODELS,
    BalanceBatches,
    CheckpointConfig,
    FeedConfig,
    LrSchedule,
    ModelConfig,
    Optimizer,
    OptimizerConfig,
    PipelineConfig,
    ProcessConfig,
    ReportConfig,
    SimulationConfig,
    StepsConfig,
    TrainOn,
    Verify,
    flag,
)

__all__ = ["BALANCE_BATCHES", "BUNDLED_MODELS", "DEFAULT_PATCH", "DEFAULT_SEQ_LEN", "LR_SCHEDULES", "MAX_TIMEOUT_S",
           "OPTIMIZERS", "TEXT_MODELS", "TOKEN_MODELS", "TRAIN_ON", "VERIFY_MODES", "VISION_MODELS", "BalanceBatches",
           "CheckpointConfig", "FeedConfig", "LrSchedule", "ModelConfig", "Optimizer", "OptimizerConfig",
           "PipelineConfig", "ProcessConfig", "ReportConfig", "SimulationConfig", "StepsConfig", "TrainConfig",
           "TrainOn", "Verify", "flag"]


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training job needs, in parts; ``stallfree train`` builds it from its flags (:meth:`from_flags`).

    Built in Python from its parts, e.g. ``TrainConfig(pipeline=PipelineConfig(stages=4), feed=FeedConfig("data/"))``
    or from flat keywords, ``TrainConfig.from_flags(stages=4, data="data/")``.
    """

    # Built in this order: the pipeline first, so that an unknown schedule fails first, listing the known ones.
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    feed: FeedConfig = field(default_factory=FeedConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    steps: StepsConfig = field(default_factory=StepsConfig)
    processes: ProcessConfig = field(default_factory=ProcessConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    seed: int = 0  # seeds the model, the data order and the augmentation: the job's own field, in no part

    def __post_init__(self) -> None:
        p, feed = self.pipeline, self.feed
        if feed.data is None and feed.samples < p.batch_size * p.dp:
            raise ValueError(f"--synthetic {feed.samples} is less than one batch per replica (--batch-size "
                             f"{p.batch_size} x --dp {p.dp}); generate at least {p.batch_size * p.dp}")
        if feed.train_on != "all" and (self.model.vision is None or feed.data is None):
            what = (f"{self.model.name} is not a vision model ({', '.join(VISION_MODELS)})" if self.model.vision is None
                    else "--synthetic's captions are all targets")
            raise ValueError(f"--train-on {feed.train_on} applies to a vision model's image-text source, but {what}: "
                             "drop --train-on")
        if self.model.kind == "tokens":
            self._check_token_job()
        elif feed.balance_batches != "none":
            raise ValueError(f"--balance-batches balances a token model's packs ({', '.join(TOKEN_MODELS)}), not "
                             f"{self.model.name}'s images: drop it")
        delay = self.simulation.link_delay
        if delay is not None:
            if not p.spec.flush:
                raise ValueError(f"--link-delay is not run under --schedule {p.schedule}: its runner sends its own "
                                 "messages, which the delay does not hold (and the summary's prediction does not "
                                 "model it); use --schedule 1f1b, its order with a flush, or drop --link-delay")
            slowest, timeout_s = max(s for _, _, s in delay.pairs), self.processes.timeout_s
            if slowest >= timeout_s:
                raise ValueError(f"--link-delay {delay} holds a message {slowest:g} s, as long as --timeout "
                                 f"{timeout_s:g} s lets a collective wait; give a shorter delay or a longer "
                                 "--timeout")
            owner = [p.owner(s) for s in range(p.model_stages)]
            delay.check(p.stages, [(a, b) for a, b in zip(owner, owner[1:], strict=False) if a != b],
                        f"{p.schedule} with {p.stages} pipeline ranks")

    def _check_token_job(self) -> None:
        """Refuse what a token model's job does not run, naming the flag (images' options; a balance, unloaded)."""
        name, feed = self.model.name, self.feed
        refused = [("--feed torch", "torch's DataLoader feeds ImageFolder images", feed.kind == "torch"),
                   ("--transform", "it augments images", feed.transform is not None)]
        for what, why, given in refused:
            if given:
                raise ValueError(f"{what} does not apply to --model {name}, a token model ({why}): drop it")
        if self.model.vision is not None and feed.data is None and self.model.vocab_size is not None:
            raise ValueError(f"--vocab-size does not apply to --synthetic's captions (--model {name}): their words "
                             "are a fixed vocabulary; drop --vocab-size")
        if feed.balance_batches != "none" and self.model.vision is not None:
            raise ValueError(f"--balance-batches {feed.balance_batches} is not run for --model {name}'s image-text "
                             "packs yet (the trainer packs them without a balance): drop --balance-batches")
        if feed.balance_batches != "none" and feed.data is None:
            raise ValueError(f"--balance-batches {feed.balance_batches} balances the Loader's packs of a token source, "
                             "but --synthetic generates its rows: give a token source, or drop --balance-batches")

    @property
    def unit(self) -> Literal["images", "tokens"]:
        """What the job's throughput counts: ``"images"``, or ``"tokens"`` for a token model."""
        return self.model.kind

    @property
    def units_per_batch(self) -> int:
        """Images, or token positions (padding included), in one replica's batch."""
        return self.pipeline.batch_size * (self.model.packed_len if self.model.kind == "tokens" else 1)

    @property
    def units_per_step(self) -> int:
        """Images, or token positions (padding included), that one step trains over all replicas."""
        return self.units_per_batch * self.pipeline.dp

    @classmethod
    def from_flags(cls, **flags: Any) -> TrainConfig:
        """The job the flat keywords describe (``stallfree train``'s flags, ``summary.json``'s ``config``).

        A keyword left out takes its part's default; ``accelerator`` and ``link_delay`` may be the user's strings.

        Raises:
            TypeError: a keyword that is no flag of a training job, naming it.
            ValueError: a value a part (or the job) refuses, naming its flag.
        """
        given: dict[str, dict[str, Any]] = {name: {} for name in _PARTS}
        seed = flags.pop("seed", 0)
        for key, value in flags.items():
            if key not in _FLAT:
                raise TypeError(f"TrainConfig has no flag {key!r}; the flags are {', '.join(sorted(_FLAT))}")
            part, name = _FLAT[key]
            given[part][name] = value
        return cls(**{part: kind(**given[part]) for part, kind in _PARTS.items()}, seed=seed)

    def flags(self) -> dict[str, Any]:
        """The flat keywords and their values (:meth:`from_flags` of them rebuilds this job)."""
        values = {key: getattr(getattr(self, part), name) for key, (part, name) in _FLAT.items()}
        return {**values, "seed": self.seed}

    def with_flags(self, **changes: Any) -> TrainConfig:
        """This job with the flat keywords ``changes`` set anew (a run of it in another folder, resumed...)."""
        return self.from_flags(**{**self.flags(), **changes})

    def to_json(self) -> dict[str, Any]:
        """The flat keywords as JSON values (``accelerator``, ``link_delay`` as strings): what ``summary.json`` keeps.

        ``TrainConfig.from_flags(**it)`` rebuilds the job.
        """
        values = self.flags()
        sim = self.simulation
        return {**values, "model_kwargs": dict(values["model_kwargs"]),
                "accelerator": None if sim.accelerator is None else str(sim.accelerator),
                "link_delay": None if sim.link_delay is None else str(sim.link_delay)}

    @property
    def ckpt_root(self) -> Path:
        """Where checkpoints go: the checkpoint folder, by default the report's ``out_dir/checkpoints``."""
        folder = self.checkpoint.dir
        return Path(folder) if folder else Path(self.report.out_dir) / "checkpoints"


# Each part's field of TrainConfig and its class (the field's default factory).
_PARTS: dict[str, Any] = {f.name: cast(Any, f.default_factory) for f in fields(TrainConfig) if f.name != "seed"}


def _flat() -> Iterator[tuple[str, tuple[str, str]]]:
    for part, kind in _PARTS.items():
        for f in fields(kind):
            yield kind.FLAT.get(f.name, f.name), (part, f.name)


# Each flat keyword's (part, field): derived from the parts, so that a new option is one field in one part.
_FLAT: dict[str, tuple[str, str]] = dict(_flat())
