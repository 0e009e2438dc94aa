"""TrainConfig is made of small frozen parts, each checking its own fields (issue 45, item 4): the flat keywords
``stallfree train``'s flags set build them once, and a test's fault hook is no part of a user's job."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from stallfree.core.accelerator import SimAccelerator
from stallfree.stage_runtime.config.train_config import (
    CheckpointConfig,
    FeedConfig,
    ModelConfig,
    OptimizerConfig,
    PipelineConfig,
    ProcessConfig,
    ReportConfig,
    SimulationConfig,
    StepsConfig,
    TrainConfig,
)
from stallfree.stage_runtime.link_delay import LinkDelay

# A job with a value other than the default in every part.
FLAGS = {"model": "mlp", "model_kwargs": {"hidden": 8}, "image_size": 16, "num_classes": 4, "seq_len": None,
         "vocab_size": None, "data": "data/train",  # seq_len and vocab_size: a token model's (issue 46)
         "attention_span": None, "balance_batches": "none",  # a token model's too (issue 48)
         "patch": None, "train_on": "all",  # a vision model's (issue 47)
         "eval_data": "data/val", "samples": 256, "feed": "stallfree", "loader_threads": 3, "verify": "open",
         "transform": "RandomHorizontalFlip()", "schedule": "gpipe", "stages": 3, "virtual_stages": 1,
         "microbatches": 2, "balance": (1, 1, 1), "dp": 2, "batch_size": 8, "optimizer": "adamw", "lr": 0.5,
         "momentum": 0.1, "weight_decay": 0.2, "lr_schedule": "cosine", "warmup_steps": 3, "epochs": 4,
         "max_steps": 9, "device": "cpu", "threads": 2, "timeout_s": 60.0, "checkpoint_dir": "ckpt",
         "checkpoint_every": 5, "keep_checkpoints": 3, "resume": True, "out_dir": "run", "progress": False,
         "log_every": 2, "plan_prediction": {"step_s": 1.0}, "accelerator": "sim:400", "link_delay": "0-1:20",
         "seed": 7}


def test_the_flat_keywords_fill_the_parts_and_come_back() -> None:
    config = TrainConfig.from_flags(**FLAGS)
    assert config.model == ModelConfig("mlp", {"hidden": 8}, 16, 4)
    assert config.pipeline == PipelineConfig("gpipe", 3, 1, 2, (1, 1, 1), 2, 8)
    assert config.optimizer == OptimizerConfig("adamw", 0.5, 0.1, 0.2, "cosine", 3)
    assert config.steps == StepsConfig(4, 9) and config.checkpoint == CheckpointConfig("ckpt", 5, 3, True)
    assert config.simulation == SimulationConfig(SimAccelerator(400), LinkDelay(((0, 1, 0.02),)))
    assert config.seed == 7 and config.report.out_dir == "run" and config.feed.verify == "open"
    assert TrainConfig.from_flags(**config.to_json()) == config  # what summary.json keeps rebuilds the job
    assert config.with_flags(out_dir="other").report.out_dir == "other"
    assert set(config.flags()) == set(FLAGS)


def test_a_test_hook_is_no_flag_of_a_job() -> None:
    # Was: TrainConfig(crash_at=(rank, step)) killed a stage process, a field of every user's config.
    assert "crash_at" not in TrainConfig().flags()
    with pytest.raises(TypeError, match=r"TrainConfig has no flag 'crash_at'; the flags are .*balance"):
        TrainConfig.from_flags(crash_at=(1, 4))


@pytest.mark.parametrize(("part", "kwargs", "message"), [
    (ModelConfig, {"image_size": 0}, r"^--image-size must be >= 1, got 0$"),
    (ModelConfig, {"num_classes": 0}, r"^--classes must be >= 1, got 0$"),
    (FeedConfig, {"kind": "ffcv"}, r"feed must be 'stallfree' or 'torch', got 'ffcv'"),
    (FeedConfig, {"loader_threads": -1}, r"^--loader-threads must be >= 0, got -1$"),
    (FeedConfig, {"transform": "RandomHorizontalFlip()"}, r"transform applies to the Loader's images"),
    (PipelineConfig, {"schedule": "pipedream"}, r"unknown schedule 'pipedream'"),
    (PipelineConfig, {"batch_size": 30, "microbatches": 4}, r"batch_size must divide into micro-batches"),
    (PipelineConfig, {"dp": 0}, r"^--dp must be >= 1, got 0$"),
    (OptimizerConfig, {"lr": float("inf")}, r"^--lr must be a finite number > 0, got inf$"),
    (StepsConfig, {"max_steps": 0}, r"^--max-steps must be >= 1, got 0 \(leave it out to run every epoch\)$"),
    (ProcessConfig, {"timeout_s": 0.5}, r"^--timeout must be a number of seconds from 1 to 604800"),
    (CheckpointConfig, {"every": -1}, r"^--checkpoint-every must be >= 0, got -1$"),
    (ReportConfig, {"log_every": 0}, r"^log_every must be >= 1, got 0$"),
    (SimulationConfig, {"accelerator": "tpu"}, r"--accelerator must be sim:IMAGES_PER_S"),
])
def test_each_part_checks_its_own_fields_naming_the_flag(part: type, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        part(**kwargs)


def test_what_ties_two_parts_is_checked_by_the_job() -> None:
    with pytest.raises(ValueError, match=r"^--synthetic 4 is less than one batch per replica \(--batch-size 8 x "):
        TrainConfig(feed=FeedConfig(samples=4), pipeline=PipelineConfig(batch_size=8, microbatches=4))
    with pytest.raises(ValueError, match=r"^--link-delay 0-1:1500 holds a message 1.5 s, as long as --timeout 1 s"):
        TrainConfig.from_flags(link_delay="0-1:1500", timeout_s=1.0)
    with pytest.raises(ValueError, match=r"--link-delay is not run under --schedule 2bw"):
        TrainConfig(pipeline=PipelineConfig(schedule="2bw"), simulation=SimulationConfig(link_delay="0-1:5"))


def test_parts_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainConfig().pipeline.stages = 4  # type: ignore[misc]


def test_every_train_flag_is_a_flat_keyword_of_the_job() -> None:
    from stallfree.commands import train

    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    dests = {a.dest for a in sub._actions} - {"help", "synthetic", "plan", "json", "json_file", "progress", "func"}
    flags = TrainConfig().flags()
    assert dests - set(flags) == set()
    # each flag's default is its part's
    assert {a.dest: a.default for a in sub._actions if a.dest in flags and a.default is not None} == {
        k: v for k, v in flags.items() if k in {a.dest for a in sub._actions if a.default is not None}}
