"""A training job end to end: the trainer runs it, the planner's simulator keeps its books and predicts its step.

``stallfree.train`` and ``train_many`` are here, in the one module that sees both the trainer
(:mod:`stallfree.stage_runtime.train`) and the planner (:mod:`stallfree.stage_runtime.plan`), which do not import
each other. The trainer's rank 0 hands :func:`account` what it measured (every rank's spans, each step's times):
the books (:func:`~stallfree.stage_runtime.plan.books.job_books`) and, for a ``2bw`` job on a simulated device, the
simulator's steady state beside 1F1B's step (:func:`~stallfree.stage_runtime.plan.asynchronous.predict_simulated_job`)
go into its summary. :func:`with_prediction` adds the simulator's prediction of the job's step, which ``stallfree
train`` prints beside what was measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.plan.asynchronous import predict_simulated_job
from stallfree.stage_runtime.plan.books import job_books
from stallfree.stage_runtime.plan.predict import predict_training
from stallfree.stage_runtime.train.trainer import run_jobs

__all__ = ["account", "predict_run", "train", "train_many", "with_prediction"]


def train(config: TrainConfig) -> dict[str, Any]:
    """Train ``config`` end to end and return the summary (also written to ``out_dir/summary.json``).

    On one machine the stage processes are spawned here; under ``torchrun`` this process is one rank.
    It prints nothing to stdout (progress bars go to stderr); ``report.format_summary`` turns the summary into
    the text ``stallfree train`` prints.

    Raises:
        StageFailure: a stage process died; names the stage and the cause. Checkpoints written before it stay.
    """
    return train_many([config])[0]


def train_many(configs: Sequence[TrainConfig]) -> list[dict[str, Any]]:
    """Run several jobs one after another in one set of processes (a benchmark sweep, a test suite).

    Starting processes and importing torch costs seconds per process; jobs of the same ``world_size`` share
    them here. Each job is as :func:`train` would run it, with its own groups, stages and files.

    Raises:
        ValueError: the jobs need different numbers of processes.
        StageFailure: as :func:`train`; the summaries of the jobs finished before stay in their ``out_dir``.
    """
    return run_jobs(configs, account=account)


def account(config: TrainConfig, summary: Mapping[str, Any], records: Sequence[dict[str, Any]],
            step_times: Sequence[tuple[float, float]],
            step_loads: Sequence[tuple[float, float, float, float]] | None = None) -> dict[str, Any]:
    """The books of a finished job (``books``), and a ``2bw`` job's simulated steady state (``predicted_steady``).

    The trainer's rank 0 calls it (:class:`~stallfree.stage_runtime.train.trainer.Account`).
    """
    books = job_books(config, summary["balance"], summary["layer_costs"], records, step_times, step_loads)
    fields: dict[str, Any] = {"books": None if books is None else books.to_dict()}
    p = config.pipeline
    if not p.spec.flush and config.simulation.accelerator is not None and p.model_stages == p.stages \
            and summary["layer_costs"]:
        # 2bw's steady state and 1F1B's step on the same split, simulated (the books need a flushing schedule)
        fields["predicted_steady"] = predict_simulated_job(config, summary, steps=16)
    return fields


def with_prediction(config: TrainConfig, summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with the plan simulator's prediction under ``predicted``, where it applies.

    :func:`~stallfree.stage_runtime.train.report.format_summary` shows it beside the measured bubble. It applies to
    a job that no plan's prediction came with (that one is shown instead) and whose schedule flushes (one step of
    ``2bw`` is not a step of the simulator's: ``plan.asynchronous``); under a simulated ``--accelerator`` it
    simulates the device's stage times.
    """
    if config.report.plan_prediction is None and "balance" in summary and config.pipeline.spec.flush:
        summary["predicted"] = predict_run(config, summary)
    return summary


def predict_run(config: TrainConfig, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The plan simulator's step time, images/s and bubble for the job ``summary`` reports (``config`` ran it).

    It simulates the layer costs rank 0 measured for the split (``summary["layer_costs"]``), so nothing is
    measured twice; a job given its ``--balance`` measured nothing, and is measured here.
    """
    measured = summary.get("layer_costs")
    layers = None if measured is None else ([LayerTimes(**layer) for layer in measured["layers"]],
                                            float(measured["optimizer_s"]))
    return predict_training(config, tuple(summary["balance"]), summary["num_classes"], measured=layers,
                            work=summary.get("micro_batch_work"))
