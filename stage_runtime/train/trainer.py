"""The pipeline-parallel trainer: ``run_jobs([TrainConfig(...)])`` runs whole jobs and returns their summaries.

``stallfree.train`` calls it (:mod:`stallfree.stage_runtime.jobs`) with the planner's books as its ``account``:
this package does not import the planner, which predicts what it runs.

Ranks: ``stages`` pipeline ranks per replica times ``dp`` replicas; global rank = replica x stages + pipeline
rank. Each rank builds the whole model from the seed (so every process starts from the same weights), keeps
its stage(s), and runs the schedule::

    pipeline rank 0:   Loader ─► images ─► stage 0 ─► ... ─►              labels ─► (send) ─┐
    last stage's rank:                        ... ─► stage N-1 ─► loss(logits, labels) ◄────┘

The labels go to the last stage by a point-to-point send of ``batch`` int64 values per step: that costs
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
from stallfree.core.device import check_device
from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.zoo import build_model, resolve
from stallfree.stage_runtime.processes import free_port, stage_threads
from stallfree.stage_runtime.train import checkpoint as ckpt
from stallfree.stage_runtime.train.launcher import PeerWatch, StageFailure, failure, launch, torchrun_env
from stallfree.stage_runtime.train.optim import lr_factor
from stallfree.stage_runtime.train.rank import Rank
from stallfree.stage_runtime.train.report import Report

__all__ = ["Account", "Fault", "StageFailure", "TrainConfig", "check", "demo_config", "run_jobs"]


class Account(Protocol):
    """What rank 0 adds to a finished job's summary from what it measured: the books, the simulator's view of it.

    Called with the job's config, its summary so far (``balance``, ``layer_costs``...), every rank's stage-clock
    records (``StageClock.to_records()``, by global rank) and each step of this run's ``(input wait, pipeline step)``
    seconds, in order; the fields it returns go into ``summary.json``. It is pickled to the stage processes: a
    module-level function.
    """

    def __call__(self, config: TrainConfig, summary: Mapping[str, Any], records: Sequence[dict[str, Any]],
                 step_times: Sequence[tuple[float, float]]) -> dict[str, Any]: ...


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
    sizes = {c.world_size for c in configs}
    if len(sizes) != 1:
        raise ValueError(f"train_many needs jobs of one world size, got {sorted(sizes)}")
    for c in configs:
        check(c)  # what the arguments alone show fails here, in one line, not in every stage process
        Path(c.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(c.out_dir) / "summary.json").unlink(missing_ok=True)
    env = torchrun_env()
    if env is not None and env[1] != configs[0].world_size:
        raise ValueError(f"torchrun started {env[1]} processes but --stages {configs[0].stages} x --dp "
                         f"{configs[0].dp} needs {configs[0].world_size}; match --nproc-per-node x --nnodes to it")
    if env is not None:
        _worker(env[0], list(configs), None, env[2], account, dict(faults or {}))  # a StageFailure names the cause
    else:
        launch(_worker, configs[0].world_size, (list(configs), free_port(), None, account, dict(faults or {})),
               stages_of=lambda r: _stages_of(configs[0], r))
    summaries = []
    for c in configs:
        path = Path(c.out_dir) / "summary.json"
        summaries.append(json.loads(path.read_text()) if path.is_file() else {})
    return summaries


def check(config: TrainConfig) -> None:
    """Check what can be checked before any process starts: the data, the model, the split.

    Raises:
        ValueError: a device this machine lacks, a dataset path that does not exist or holds no images, more model
            stages than layers, a ``balance`` of the wrong length or sum, or ``resume`` from a checkpoint of another
            model, split, schedule or optimizer; each message names the argument and the fix.
    """
    from stallfree.pipeline.readers import open_source

    env = torchrun_env()  # under torchrun, this machine's processes share its GPUs
    check_device(config.device, processes=int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if env else config.world_size)
    if env is not None and config.link_delay is not None:
        config.link_delay.check_one_machine(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), env[1])

    if config.resume and ckpt.latest(config.ckpt_root) is not None:  # another model, split or schedule: named here
        ckpt.check_job(config.ckpt_root, ckpt.latest(config.ckpt_root) or 0, config)

    for name, data in (("training data", config.data), ("--eval", config.eval_data)):
        if data is None:
            continue
        try:
            reader = open_source(data)
        except (OSError, ValueError) as err:
            raise ValueError(f"{name} {data}: {err}; give an ImageFolder, a CSV/Parquet file list or an "
                             "ingested shard folder") from None
        if len(reader) == 0:
            raise ValueError(f"{name} {data}: holds no images; give a dataset with at least one batch")
    if config.transform is not None:
        _check_transform(config)
    resolve(config.model)
    layers = len(build_model(config.model, config.num_classes or 10, config.image_size, **config.model_kwargs))
    stages = config.model_stages
    if stages > layers:
        raise ValueError(f"--stages {config.stages} with schedule {config.schedule} makes {stages} model stages "
                         f"but {config.model} has {layers} layers; use at most {layers} stages (each needs a layer)")
    if config.balance is not None:
        text = ",".join(map(str, config.balance))
        if len(config.balance) != stages:
            raise ValueError(f"--balance {text} has {len(config.balance)} entries but the job has {stages} model "
                             f"stages; give {stages} layer counts")
        if sum(config.balance) != layers or min(config.balance) < 1:
            raise ValueError(f"--balance {text} sums to {sum(config.balance)} but {config.model} has {layers} "
                             f"layers; give {stages} counts >= 1 that sum to {layers}, or leave --balance out")


def _check_transform(config: TrainConfig) -> None:
    """Build ``--transform`` and translate it as the Loader will, so that a bad one fails before any process."""
    from stallfree.stage_runtime.train.augment import training_transform
    from stallfree.transforms.from_torchvision import to_steps

    transform = training_transform(config.transform, config.image_size)
    try:
        to_steps(transform)
    except TypeError as err:
        raise ValueError(f"--transform {config.transform!r}: {err}") from None


def _stages_of(config: TrainConfig, rank: int) -> list[int]:
    pp = rank % config.stages
    return [s for s in range(config.model_stages) if config.spec.owner(s, config.stages) == pp]


def _worker(rank: int, configs: list[TrainConfig], port: int | None, local_rank: int | None, account: Account | None,
            faults: dict[int, Fault]) -> None:
    first = configs[0]
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(first.world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(stage_threads(first.world_size, first.threads))
    backend = "nccl" if first.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=first.world_size,
                            timeout=datetime.timedelta(seconds=first.timeout_s))
    watch = PeerWatch(rank, first.world_size)
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
    step, start_epoch = job.restore() if c.resume else (0, 0)
    out = Path(c.out_dir)
    report = Report(out, c.stages, c.dp, c.progress and rank == 0, c.log_every,
                    resume_step=step if c.resume else None) if rank == 0 else None
    total_steps = c.total_steps(job.steps_per_epoch)
    stats = _StepStats(job, report)
    wall0, accuracy = time.perf_counter(), None
    for epoch in range(start_epoch, c.epochs):
        if step >= total_steps:
            break
        done = step - epoch * job.steps_per_epoch
        it = None
        if job.feed is not None:
            job.feed.set_epoch(epoch)
            it = iter(job.feed)
        if report is not None:
            report.epoch(epoch, min(job.steps_per_epoch, total_steps - epoch * job.steps_per_epoch), done)
        for _ in range(done, job.steps_per_epoch):
            if step >= total_steps:
                break
            t0 = time.perf_counter()
            images, labels = next(it) if it is not None else (None, None)
            wait = time.perf_counter() - t0
            if job.feed is not None and not hasattr(job.feed, "clock"):
                job.clock.record("input", "waiting", t0, t0 + wait, step)
            lr = c.lr * lr_factor(step, total_steps, c.warmup_steps, c.lr_schedule)  # what this step uses
            loss, start, end, busy = job.train_step(images, labels)
            step += 1
            if fault is not None and (fault.rank, fault.step) == (rank, step):
                os.kill(os.getpid(), fault.signal)
            stats.post(step, epoch, lr, [loss if job.last else 0.0, wait if job.first else 0.0, busy, t0, start, end])
            if c.checkpoint_every and step % c.checkpoint_every == 0 and step < total_steps:
                stats.settle()
                job.save(step, step // job.steps_per_epoch)
        stats.settle()
        accuracy = job.evaluate()
        if report is not None:
            report.eval(epoch, step, accuracy) if accuracy >= 0 else report.close_bar()
    stats.settle()
    # The epoch the next step belongs to, which a resumed run continues from the feed's position in it. Not the loop's
    # `epoch`: a run that stopped mid-epoch at --max-steps has moved it on to the next epoch before breaking out.
    job.save(step, step // job.steps_per_epoch)
    versions = job.weight_versions()  # 2bw's versions and staleness per pipeline rank ({} otherwise); a collective
    # Rank 0 gathers every rank's spans through the process group: the machines may not share --out.
    spans: list[Any] | None = [None] * c.world_size if rank == 0 else None
    dist.gather_object(job.clock.to_records(), spans, dst=0)
    if report is not None:
        wall = time.perf_counter() - wall0
        config = c.to_json()  # TrainConfig(**config) rebuilds it
        summary = {"model": c.model, "stages": c.stages, "model_stages": c.model_stages, "replicas": c.dp,
                   "schedule": c.schedule, "microbatches": c.microbatches, "balance": list(job.balance),
                   # a split not given was measured on this run, or read from the checkpoint resumed
                   "balance_source": "given" if c.balance else "checkpoint" if c.resume else "measured",
                   "steps": step, "wall_s": wall, "final_loss": report.last_loss,
                   "eval_top1": accuracy if accuracy is not None and accuracy >= 0 else None,
                   "bubble_theory": c.spec.bubble(c.stages, c.microbatches, c.virtual_stages),
                   "feed": c.feed, "plan_prediction": c.plan_prediction, "accelerator": config["accelerator"],
                   "accelerator_images_per_s": _ideal(c),
                   "num_classes": job.num_classes, "checkpoint": str(ckpt.step_dir(c.ckpt_root, step)),
                   "layer_costs": job.layer_costs,
                   "config": config, **versions, **report.fractions()}
        report.close()
        if account is not None:
            summary.update(account(c, summary, spans or [], report.step_times))
        merged = StageClock()
        for r, records in enumerate(spans or []):
            one = StageClock()
            one.merge(records)
            one.dump(out / f"spans-{r}.json")
            merged.merge(records)
        merged.to_chrome_trace(out / "trace.json")
        summary["trace"] = str(out / "trace.json")
        atomic_write(out / "summary.json", json.dumps(summary, indent=1, default=str).encode())


class _StepStats:
    """Each step's figures, gathered over the pipeline ranks one step late: no collective waits between steps.

    Every rank posts its figures of step ``k`` (``[loss, input wait, busy, t0, start, end]``: the last stage's loss,
    stage 0's wait for its batch, the rank's busy seconds, and ``time.perf_counter`` before the batch was read and
    at the start and end of its schedule step) in an ``all_gather`` with ``async_op=True``, and waits for step
    ``k-1``'s only then, long after every rank posted it. A blocking collective after every step would be a barrier
    across the pipeline: under ``2bw`` at S>=3 (no instant ends every rank's part of a step) and under the
    zero-bubble schedules (the other ranks still run weight gradients when rank 0 is done) it idles ranks. Before
    anything that needs every rank (checkpoint, evaluation, the end) :meth:`settle` waits for the last one.
    Pipeline rank 0 hands the gathered figures to the :class:`Report`, each step once and in order.
    """

    def __init__(self, job: Rank, report: Report | None):
        self.job, self.report = job, report
        # The pipeline's step is timed across its ranks on perf_counter, which only the processes of one machine
        # share; a job across machines times it on pipeline rank 0 alone.
        local = os.environ.get("LOCAL_WORLD_SIZE")
        self.one_clock = local is None or int(local) >= job.config.world_size
        self._pending: tuple[Any, list[torch.Tensor], int, int, float] | None = None

    def post(self, step: int, epoch: int, lr: float, figures: list[float]) -> None:
        """Post step ``step``'s figures, then wait for (and report) the step before it."""
        mine = torch.tensor(figures, dtype=torch.float64, device=self.job.comm)  # float64: perf_counter's seconds
        every = [torch.zeros_like(mine) for _ in range(self.job.config.stages)]
        work = dist.all_gather(every, mine, group=self.job.pp_group, async_op=True)
        previous, self._pending = self._pending, (work, every, step, epoch, lr)
        if previous is not None:
            self._finish(previous)

    def settle(self) -> None:
        """Wait for the last step posted and report it; the next step starts after a synchronisation."""
        if self._pending is not None:
            self._finish(self._pending)
            self._pending = None
        if self.report is not None:
            self.report.synced()

    def _finish(self, pending: tuple[Any, list[torch.Tensor], int, int, float]) -> None:
        work, every, step, epoch, lr = pending
        work.wait()
        if self.report is None:
            return
        rows = [[float(v) for v in t.cpu()] for t in every]  # one per pipeline rank, in pipeline order
        c = self.job.config
        ends = [r[5] for r in rows] if self.one_clock else [rows[0][5]]
        self.report.step(step, epoch, loss=sum(r[0] for r in rows), wait_s=rows[0][1], t0=rows[0][3],
                         start=rows[0][4], end=max(ends), busy_s=sum(r[2] for r in rows), images=c.batch_size,
                         lr=lr)


def _ideal(c: TrainConfig) -> float | None:
    """What the replicas could train on the simulated device with no input wait and no bubble (None: real)."""
    return None if c.accelerator is None else c.accelerator.images_per_s * c.dp


def demo_config(train_dir: str, eval_dir: str, out_dir: str, *, epochs: int = 6, progress: bool = True) -> TrainConfig:
    """The demo's job: a small CNN in 2 stages with 1F1B on a synthetic ImageFolder, sized for a 2-core CPU.

    With ``make_image_folder(train_dir, num_classes=4, per_class=150, size=(48, 48))`` and a held-out folder of
    another seed it reaches well above the 25% of chance in about 15 s of training on 2 cores.
    """
    return TrainConfig(model="small_cnn", data=train_dir, eval_data=eval_dir, image_size=32, batch_size=32,
                       microbatches=4, stages=2, schedule="1f1b", epochs=epochs, lr=0.01, out_dir=out_dir,
                       progress=progress)
