"""The pipeline-parallel trainer: ``run_jobs([config, ...])`` runs whole jobs and returns their summaries.

``stallfree.train`` calls it (:mod:`stallfree.stage_runtime.jobs`) with the planner's books as its ``account``:
this package does not import the planner, which predicts what it runs.

Ranks: ``stages`` pipeline ranks per replica times ``dp`` replicas; global rank = replica x stages + pipeline
rank. Each rank builds the whole model from the seed (so every process starts from the same weights), keeps
its stage(s), and runs the schedule::

    pipeline rank 0:   Loader ─► task.batch ─► inputs ─► stage 0 ─► ... ─►           targets ─► (send) ─┐
    last stage's rank:                                     ... ─► stage N-1 ─► task.loss(output, targets) ◄─┘

The job's task (:mod:`stallfree.stage_runtime.models.tasks`, chosen from the model) turns each feed item into a
``Batch``: ``(images, labels)`` of an image model, or a token model's packed dict (inputs ``[input_ids,
position_ids, document_index]``, targets ``labels``); the loop is the same for both. The targets go to the last
stage by a point-to-point send of ``batch`` int64 values per step (``batch x seq_len`` for tokens): that costs
8 bytes per image against the activations the pipeline already sends, where a second, label-only reader over
the same sampler state would have to re-list the dataset and keep two cursors in step.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from stallfree.core.atomic import atomic_write
from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.processes import free_port, stage_threads, torchrun_env
from stallfree.stage_runtime.train import checkpoint as ckpt
from stallfree.stage_runtime.train.evaluation import evaluate
from stallfree.stage_runtime.train.launcher import PeerWatch, StageFailure, failure, launch
from stallfree.stage_runtime.train.optim import lr_factor
from stallfree.stage_runtime.train.preflight import check
from stallfree.stage_runtime.train.rank import Rank
from stallfree.stage_runtime.train.report import Report
from stallfree.stage_runtime.train.step_stats import StepStats

__all__ = ["Account", "Fault", "StageFailure", "TrainConfig", "demo_config", "run_jobs", "vision_demo_config"]


class Account(Protocol):
    """What rank 0 adds to a finished job's summary from what it measured: the books, the simulator's view of it.

    Called with the job's config, its summary so far (``balance``, ``layer_costs``...), every rank's stage-clock
    records (``StageClock.to_records()``, by global rank), each step of this run's ``(input wait, pipeline step)``
    seconds and its ``(wait for the slowest replica, replica 0's work, the replicas' mean work and mean padding
    slots)`` (``Report.step_loads``), in order; the fields it returns go into ``summary.json``. It is pickled to the
    stage processes: a module-level function.
    """

    def __call__(self, config: TrainConfig, summary: Mapping[str, Any], records: Sequence[dict[str, Any]],
                 step_times: Sequence[tuple[float, float]],
                 step_loads: Sequence[tuple[float, float, float, float]]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Fault:
    """A test's fault: global rank ``rank`` sends itself ``signal`` (default SIGKILL) right after step ``step``.

    Not part of a job's configuration: a test hands it to :func:`run_jobs` for one job.
    """

    rank: int
    step: int
    signal: int = signal.SIGKILL


def run_jobs(configs: Sequence[TrainConfig], *, account: Account | None = None,
             faults: Mapping[int, Fault] | None = None) -> list[dict[str, Any]]:
    """Run jobs one after another in one set of processes; each job's summary (also in its ``out_dir/summary.json``).

    On one machine the stage processes are spawned here; under ``torchrun`` this process is one rank. Starting
    processes and importing torch costs seconds per process; jobs of the same ``world_size`` share them (a
    benchmark sweep, a test suite), each with its own groups, stages and files. It prints nothing to stdout
    (progress bars go to stderr); ``report.format_summary`` turns a summary into the text ``stallfree train`` prints.

    Args:
        configs: the jobs, all of one ``world_size``.
        account: what rank 0 adds to each summary from the job's spans (``stallfree.train``'s: the books).
        faults: a test's fault per job, by its index in ``configs``.

    Raises:
        ValueError: the jobs need different numbers of processes.
        StageFailure: a stage process died; names the stage and the cause. Checkpoints written before it stay, and
            the summaries of the jobs finished before stay in their ``out_dir``.
    """
    if not configs:
        return []
    sizes = {c.pipeline.world_size for c in configs}
    if len(sizes) != 1:
        raise ValueError(f"train_many needs jobs of one world size, got {sorted(sizes)}")
    for c in configs:
        check(c)  # what the arguments alone show fails here, in one line, not in every stage process (preflight)
        Path(c.report.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(c.report.out_dir) / "summary.json").unlink(missing_ok=True)
    env, shape = torchrun_env(), configs[0].pipeline
    if env is not None and env[1] != shape.world_size:
        raise ValueError(f"torchrun started {env[1]} processes but --stages {shape.stages} x --dp {shape.dp} needs "
                         f"{shape.world_size}; match --nproc-per-node x --nnodes to it")
    if env is not None:
        _worker(env[0], list(configs), None, env[2], account, dict(faults or {}))  # a StageFailure names the cause
    else:
        launch(_worker, shape.world_size, (list(configs), free_port(), None, account, dict(faults or {})),
               stages_of=lambda r: _stages_of(configs[0], r))
    summaries = []
    for c in configs:
        path = Path(c.report.out_dir) / "summary.json"
        summaries.append(json.loads(path.read_text()) if path.is_file() else {})
    return summaries


def _stages_of(config: TrainConfig, rank: int) -> list[int]:
    p = config.pipeline
    return [s for s in range(p.model_stages) if p.owner(s) == rank % p.stages]


def _worker(rank: int, configs: list[TrainConfig], port: int | None, local_rank: int | None, account: Account | None,
            faults: dict[int, Fault]) -> None:
    first, world = configs[0], configs[0].pipeline.world_size
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                          LOCAL_RANK=str(rank))
    torch.set_num_threads(stage_threads(world, first.processes.threads))
    backend = "nccl" if first.processes.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=first.processes.timeout_s))
    watch = PeerWatch(rank, world)
    try:
        for index, config in enumerate(configs):
            _run(rank, config, local_rank if local_rank is not None else rank, account, faults.get(index))
    except Exception as err:  # every failure leaves as one StageFailure naming the rank that caused it
        raise failure(rank, err, lambda r: _stages_of(first, r), watch) from err
    finally:
        watch.close()
        dist.destroy_process_group()


def _run(rank: int, c: TrainConfig, local_rank: int, account: Account | None, fault: Fault | None) -> None:
    job = Rank(rank, c, local_rank)
    job.build()
    step, start_epoch = job.restore() if c.checkpoint.resume else (0, 0)
    report = Report(Path(c.report.out_dir), c.pipeline.stages, c.pipeline.dp, c.report.progress and rank == 0,
                    c.report.log_every, resume_step=step if c.checkpoint.resume else None,
                    unit=c.unit) if rank == 0 else None
    total_steps = c.steps.total(job.steps_per_epoch)
    stats = StepStats(job, report)
    wall0, accuracy = time.perf_counter(), None
    counted = [0, 0, 0]  # stage 0's samples (images, or real tokens) in this run's first step, in the others; steps
    feeds = job.feeds  # pipeline rank 0's; the others get their input from the previous rank
    for epoch in range(start_epoch, c.steps.epochs):
        if step >= total_steps:
            break
        done = step - epoch * job.steps_per_epoch
        it = None
        if feeds is not None:
            feeds.train.set_epoch(epoch)
            it = iter(feeds.train)
        if report is not None:
            report.epoch(epoch, min(job.steps_per_epoch, total_steps - epoch * job.steps_per_epoch), done)
        for _ in range(done, job.steps_per_epoch):
            if step >= total_steps:
                break
            t0 = time.perf_counter()
            batch = job.task.batch(next(it)) if it is not None else None
            wait = time.perf_counter() - t0
            if feeds is not None and not feeds.clocked:  # the Loader records its own waits
                job.clock.record("input", "waiting", t0, t0 + wait, step)
            o = c.optimizer
            lr = o.lr * lr_factor(step, total_steps, o.warmup_steps, o.lr_schedule)  # what this step uses
            loss, start, end, busy = job.train_step(batch)
            if batch is not None:
                counted[0 if counted[2] == 0 else 1] += batch.samples
                counted[2] += 1
            step += 1
            if fault is not None and (fault.rank, fault.step) == (rank, step):
                os.kill(os.getpid(), fault.signal)
            load = [job.task.work(batch.inputs), c.units_per_batch - batch.samples if c.unit == "tokens" else 0.0] \
                if batch is not None else [0.0, 0.0]  # stage 0's batch: its work on the device, its padding slots
            stats.post(step, epoch, lr, [loss if job.last else 0.0, wait if job.first else 0.0, busy, t0, start, end,
                                         *load])
            if c.checkpoint.every and step % c.checkpoint.every == 0 and step < total_steps:
                stats.settle()
                job.save(step, step // job.steps_per_epoch)
        stats.settle()
        accuracy = evaluate(job)
        if report is not None:
            report.eval(epoch, step, accuracy) if accuracy >= 0 else report.close_bar()
    stats.settle()
    # The epoch the next step belongs to, which a resumed run continues from the feed's position in it. Not the loop's
    # `epoch`: a run that stopped mid-epoch at --max-steps has moved it on to the next epoch before breaking out.
    job.save(step, step // job.steps_per_epoch)
    versions = job.weight_versions()  # 2bw's versions and staleness per pipeline rank ({} otherwise); a collective
    # Rank 0 gathers every rank's spans through the process group: the machines may not share --out.
    gathered: list[Any] | None = [None] * c.pipeline.world_size if rank == 0 else None
    dist.gather_object((job.clock.to_records(), counted), gathered, dst=0)
    if report is not None:
        spans = [records for records, _ in gathered or []]
        summary = {**_summary(c, job, step, time.perf_counter() - wall0, accuracy, report), **versions,
                   **_real_tokens(c, [n for _, n in gathered or []], report)}
        report.close()
        _write(c, summary, spans, (report.step_times, report.step_loads), account)


def _summary(c: TrainConfig, job: Rank, step: int, wall: float, accuracy: float | None,
             report: Report) -> dict[str, Any]:
    """What ``summary.json`` holds of a finished job, before the spans and the account are added."""
    p, config = c.pipeline, c.to_json()  # TrainConfig.from_flags(**config) rebuilds it
    return {"model": c.model.name, "stages": p.stages, "model_stages": p.model_stages, "replicas": p.dp,
            "schedule": p.schedule, "microbatches": p.microbatches, "balance": list(job.balance),
            # a split not given was measured on this run, or read from the checkpoint resumed
            "balance_source": "given" if p.balance else "checkpoint" if c.checkpoint.resume else "measured",
            "steps": step, "wall_s": wall, "final_loss": report.last_loss,
            "eval_top1": accuracy if accuracy is not None and accuracy >= 0 else None,
            "bubble_theory": p.spec.bubble(p.stages, p.microbatches, p.virtual_stages),
            "unit": c.unit, "feed": c.feed.kind, "plan_prediction": c.report.plan_prediction,
            "accelerator": config["accelerator"],
            f"accelerator_{c.unit}_per_s": _ideal(c),
            "num_classes": job.num_classes, "checkpoint": str(ckpt.step_dir(c.ckpt_root, step)),
            "layer_costs": job.layer_costs, "config": config, **report.fractions(),
            # a token micro-batch's mean work on the device (its tokens' cost), what a prediction of the job charges
            **({"micro_batch_work": report.mean_work() / p.microbatches} if c.unit == "tokens" else {})}


def _real_tokens(c: TrainConfig, counted: list[list[int]], report: Report) -> dict[str, Any]:
    """A token job's real (not padding) tokens per second over every replica, and the padding's share of the slots.

    ``counted``: each rank's ``[tokens in this run's first step, in the others, steps]`` (stage 0's ranks count; the
    others count none); the first step is left out when there are others, as the summary's throughput leaves it out.
    """
    if c.unit != "tokens":
        return {}
    real = sum(n[1] if n[2] > 1 else n[0] for n in counted)
    seconds, slots = report.measured_seconds()
    return {"real_tokens_per_s": real / seconds if seconds else 0.0,
            "padding_fraction": 1 - real / slots if slots else 0.0}


def _write(c: TrainConfig, summary: dict[str, Any], spans: list[Any],
           steps: tuple[list[tuple[float, float]], list[tuple[float, float, float, float]]],
           account: Account | None) -> None:
    """Write every rank's spans, the merged trace and ``summary.json`` (with what ``account`` adds) under ``--out``."""
    out = Path(c.report.out_dir)
    if account is not None:
        summary.update(account(c, summary, spans, *steps))
    merged = StageClock()
    for r, records in enumerate(spans):
        one = StageClock()
        one.merge(records)
        one.dump(out / f"spans-{r}.json")
        merged.merge(records)
    merged.to_chrome_trace(out / "trace.json")
    summary["trace"] = str(out / "trace.json")
    atomic_write(out / "summary.json", json.dumps(summary, indent=1, default=str).encode())


def _ideal(c: TrainConfig) -> float | None:
    """What the replicas could train on the simulated device with no input wait and no bubble (None: real)."""
    return None if c.simulation.accelerator is None else c.simulation.accelerator.images_per_s * c.pipeline.dp


def demo_config(train_dir: str, eval_dir: str, out_dir: str, *, epochs: int = 6, progress: bool = True) -> TrainConfig:
    """The demo's job: a small CNN in 2 stages with 1F1B on a synthetic ImageFolder, sized for a 2-core CPU.

    With ``make_image_folder(train_dir, num_classes=4, per_class=150, size=(48, 48))`` and a held-out folder of
    another seed it reaches well above the 25% of chance in about 15 s of training on 2 cores.
    """
    return TrainConfig.from_flags(model="small_cnn", data=train_dir, eval_data=eval_dir, image_size=32, batch_size=32,
                                  microbatches=4, stages=2, schedule="1f1b", epochs=epochs, lr=0.01, out_dir=out_dir,
                                  progress=progress)


def vision_demo_config(train_dir: str, eval_dir: str, out_dir: str, *, epochs: int = 6,
                       progress: bool = True) -> TrainConfig:
    """``stallfree demo --vision``'s job: ``vlm_tiny`` in 2 stages with 1F1B on image-text shards of the caption task.

    Images resized to 16x16 in patches of 8 (4 tokens each), rows of 32 tokens (two captioned images a row), AdamW:
    with ``make_caption_dataset(..., count=640)`` ingested (``--layout caption``, ``add_eos="</s>"``) its loss falls
    from about 4 (the 54 words' log) to under 1 in about a minute on 2 cores.
    """
    return TrainConfig.from_flags(model="vlm_tiny", data=train_dir, eval_data=eval_dir, seq_len=32, image_size=16,
                                  patch=8, batch_size=16, microbatches=4, stages=2, schedule="1f1b", epochs=epochs,
                                  optimizer="adamw", lr=3e-3, out_dir=out_dir, progress=progress)
