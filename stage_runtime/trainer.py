"""The pipeline-parallel trainer: ``train(TrainConfig(...))`` runs the whole job and returns its summary.

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

import copy
import datetime
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stallfree.stage_runtime import checkpoint as ckpt
from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.feed import make_feed
from stallfree.stage_runtime.launcher import StageFailure, free_port, launch, torchrun_env
from stallfree.stage_runtime.models import build_model, resolve
from stallfree.stage_runtime.partition import plan
from stallfree.stage_runtime.report import Report, format_summary
from stallfree.stage_runtime.schedules import (
    SCHEDULES,
    build_schedule,
    check_microbatches,
    stage_owner,
    stages_per_rank,
    theoretical_bubble,
)
from stallfree.stage_runtime.stage import TimedStage, chain_forward

__all__ = ["StageFailure", "TrainConfig", "demo_config", "train", "train_many"]


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training job needs; ``stallfree train`` builds it from its flags."""

    model: str = "small_cnn"  # a bundled name (stallfree.stage_runtime.models.MODELS) or package.module:factory
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    data: str | None = None  # training ImageFolder / file list / shard folder; None: generated tensors
    eval_data: str | None = None  # held-out split, evaluated each epoch (top-1); None with data=None: generated
    image_size: int = 32
    num_classes: int | None = None  # default: the Loader's class count (10 for generated tensors)
    samples: int = 2048  # generated tensors only: training samples
    feed: str = "stallfree"  # "stallfree" (the Loader) or "torch" (torch's DataLoader, for comparison)
    loader_threads: int | None = None  # Loader threads / DataLoader workers (default: the Loader's / 2)
    stages: int = 2  # pipeline ranks (processes) per replica
    schedule: str = "1f1b"
    virtual_stages: int = 2  # stages per rank for interleaved-1f1b and zero-bubble
    microbatches: int = 4
    balance: tuple[int, ...] | None = None  # layers per model stage; None: measured
    dp: int = 1  # data-parallel pipeline replicas
    batch_size: int = 32  # per replica and step, split into `microbatches`
    epochs: int = 1
    max_steps: int | None = None  # stop after this many steps in all
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 0.0
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
    crash_at: tuple[int, int] | None = None  # fault injection for tests: (global rank, step) SIGKILLs itself

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        for name in ("stages", "microbatches", "dp", "batch_size", "epochs", "image_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size % self.microbatches:
            raise ValueError(f"batch_size must divide into micro-batches: batch_size={self.batch_size}, "
                             f"microbatches={self.microbatches}; use a multiple of {self.microbatches}")
        check_microbatches(self.schedule, self.stages, self.microbatches)
        if self.schedule == "zbv" and self.stages < 2:
            raise ValueError("schedule 'zbv' needs at least 2 pipeline ranks (--stages 2)")

    @property
    def model_stages(self) -> int:
        """How many pieces the model is cut into: pipeline ranks x stages per rank."""
        return self.stages * stages_per_rank(self.schedule, self.virtual_stages)

    @property
    def world_size(self) -> int:
        """All processes: pipeline ranks x replicas."""
        return self.stages * self.dp

    @property
    def ckpt_root(self) -> Path:
        """Where checkpoints go."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(self.out_dir) / "checkpoints"


def train(config: TrainConfig) -> dict[str, Any]:
    """Train ``config`` end to end and return the summary (also written to ``out_dir/summary.json``).

    On one machine the stage processes are spawned here; under ``torchrun`` this process is one rank.

    Raises:
        StageFailure: a stage process died; names the stage and the cause. The last checkpoint is intact.
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
    if not configs:
        return []
    sizes = {c.world_size for c in configs}
    if len(sizes) != 1:
        raise ValueError(f"train_many needs jobs of one world size, got {sorted(sizes)}")
    for c in configs:
        resolve(c.model)  # a bad --model fails here, in one line, not in every stage process
        Path(c.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(c.out_dir) / "summary.json").unlink(missing_ok=True)
    env = torchrun_env()
    if env is not None:
        _worker(env[0], list(configs), None, env[2])
    else:
        launch(_worker, configs[0].world_size, (list(configs), free_port(), None),
               stages_of=lambda r: _stages_of(configs[0], r))
    summaries = []
    for c in configs:
        path = Path(c.out_dir) / "summary.json"
        summaries.append(json.loads(path.read_text()) if path.is_file() else {})
    return summaries


def _stages_of(config: TrainConfig, rank: int) -> list[int]:
    pp = rank % config.stages
    return [s for s in range(config.model_stages) if stage_owner(config.schedule, s, config.stages) == pp]


def _stage_shapes(layers: list[nn.Module], bounds: list[int], micro: tuple[int, ...]) -> list[tuple[Any, Any]]:
    """Each stage's (input, output) as meta tensors, from a forward of a meta copy of the model.

    Giving them to ``PipelineStage`` skips its runtime shape inference, which runs the stages' forward on
    uninitialised buffers and so writes NaN into BatchNorm's running statistics of every stage but the first.
    """
    meta = [copy.deepcopy(layer).to("meta") for layer in layers]
    x = torch.empty(micro, device="meta")
    shapes = []
    with torch.no_grad():
        for s in range(len(bounds) - 1):
            inp = x
            for layer in meta[bounds[s]:bounds[s + 1]]:
                x = layer(x)
            # requires_grad says which tensors carry a gradient back: all activations, not the images.
            shapes.append((inp.detach().requires_grad_(s > 0), x.detach().requires_grad_(True)))
    return shapes


class _Job:
    """One rank's view of the job: groups, its stages, schedule, optimizer, feeds."""

    def __init__(self, rank: int, config: TrainConfig, local_rank: int):
        c = self.config = config
        self.rank, self.pp, self.replica = rank, rank % c.stages, rank // c.stages
        cuda = c.device.startswith("cuda")
        self.device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        self.comm = self.device if cuda else torch.device("cpu")  # NCCL sends CUDA tensors, gloo CPU ones
        # Every rank must create every group, in the same order.
        self.pp_group = self.dp_group = None
        for d in range(c.dp):
            g = dist.new_group([d * c.stages + p for p in range(c.stages)])
            if d == self.replica:
                self.pp_group = g
        for p in range(c.stages):
            g = dist.new_group([d * c.stages + p for d in range(c.dp)])
            if p == self.pp:
                self.dp_group = g
        self.base = self.replica * c.stages  # global rank of this replica's pipeline rank 0
        self.owner = [self.base + stage_owner(c.schedule, s, c.stages) for s in range(c.model_stages)]
        self.clock = StageClock()
        self.feed = self.eval_feed = None
        info = torch.zeros(2, dtype=torch.int64, device=self.comm)
        if self.pp == 0:
            common = {"batch_size": c.batch_size, "image_size": c.image_size, "seed": c.seed, "replica": self.replica,
                      "replicas": c.dp, "samples": c.samples, "device": str(self.device),
                      "num_classes": c.num_classes or 10, "kind": c.feed, "workers": c.loader_threads}
            self.feed = make_feed(c.data, train=True, clock=self.clock, **common)
            if c.eval_data is not None or c.data is None:
                self.eval_feed = make_feed(c.eval_data, train=False, **common)
            info[0] = len(self.feed)
            info[1] = c.num_classes or len(self.feed.classes)
        dist.broadcast(info, self.base, group=self.pp_group)
        self.steps_per_epoch, self.num_classes = int(info[0]), int(info[1])

    def build(self) -> None:
        """Plan the split (measured on global rank 0), build this rank's stages, schedule and optimizer."""
        c = self.config
        torch.manual_seed(c.seed)
        layers = list(build_model(c.model, self.num_classes, c.image_size, **c.model_kwargs))
        chosen: list[Any] = [c.balance]
        if c.resume and c.balance is None and self.rank == 0 and ckpt.latest(c.ckpt_root) is not None:
            chosen = [tuple(ckpt.load_meta(c.ckpt_root, ckpt.latest(c.ckpt_root))["balance"])]
            if c.progress:
                print(f"split: balance {','.join(map(str, chosen[0]))} (from the checkpoint)", flush=True)
        elif self.rank == 0:
            sample = torch.randn(c.batch_size // c.microbatches, 3, c.image_size, c.image_size)
            partition = plan(layers, c.model_stages, sample=sample, balance=c.balance)
            if c.progress:
                print(partition.describe(), flush=True)
            chosen = [partition.balance]
        dist.broadcast_object_list(chosen, 0)
        self.balance = tuple(chosen[0])
        bounds = [sum(self.balance[:i]) for i in range(len(self.balance) + 1)]
        self.modules = {s: nn.Sequential(*layers[bounds[s]:bounds[s + 1]]).to(self.device)
                        for s in range(c.model_stages) if self.owner[s] == self.rank}
        shapes = _stage_shapes(layers, bounds, (c.batch_size // c.microbatches, 3, c.image_size, c.image_size))
        self.stages = [TimedStage(m, s, c.model_stages, self.device, input_args=shapes[s][0],
                                  output_args=shapes[s][1], group=self.pp_group, clock=self.clock)
                       for s, m in self.modules.items()]
        self.schedule = build_schedule(c.schedule, self.stages, c.microbatches, nn.functional.cross_entropy)
        self.params = [p for m in self.modules.values() for p in m.parameters()]
        self.optimizer = torch.optim.SGD(self.params, lr=c.lr, momentum=c.momentum, weight_decay=c.weight_decay)

    @property
    def first(self) -> bool:
        return self.owner[0] == self.rank

    @property
    def last(self) -> bool:
        return self.owner[-1] == self.rank

    def save(self, step: int, epoch: int) -> None:
        """Every rank saves its file; after a barrier global rank 0 writes the manifest that makes it current."""
        c = self.config
        state = {"modules": {str(s): m.state_dict() for s, m in self.modules.items()},
                 "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                 "feed": json.dumps(self.feed.state_dict()) if self.feed is not None else ""}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        ckpt.save_rank(c.ckpt_root, step, self.rank, state)
        dist.barrier()
        if self.rank == 0:
            ckpt.save_meta(c.ckpt_root, step, {"step": step, "epoch": epoch, "balance": list(self.balance),
                                               "world_size": c.world_size, "schedule": c.schedule})
            ckpt.prune(c.ckpt_root, c.keep_checkpoints)
        dist.barrier()

    def restore(self) -> tuple[int, int]:
        """Load the latest checkpoint; returns ``(step, epoch)`` to continue from (``(0, 0)`` without one)."""
        c = self.config
        step = ckpt.latest(c.ckpt_root)
        if step is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {c.ckpt_root} (no latest.json)")
        meta = ckpt.load_meta(c.ckpt_root, step)
        if tuple(meta["balance"]) != self.balance:
            raise ValueError(f"checkpoint was saved with balance {meta['balance']}, this run splits "
                             f"{list(self.balance)}; pass --balance {','.join(map(str, meta['balance']))}")
        state = ckpt.load_rank(c.ckpt_root, step, self.rank)
        for s, m in self.modules.items():
            m.load_state_dict(state["modules"][str(s)])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        if self.feed is not None and state["feed"]:
            self.feed.load_state_dict(json.loads(state["feed"]))
        return step, int(meta["epoch"])

    def train_step(self, images: Any, labels: Any) -> tuple[float, float, float]:
        """One optimizer step; returns ``(summed micro-batch loss or 0, schedule seconds, busy seconds)``."""
        c = self.config
        for stage in self.stages:
            stage.step_number += 1
        if labels is not None:
            labels = labels.to(self.comm)
        if self.first and not self.last:
            dist.send(labels, self.owner[-1])
        elif self.last and not self.first:
            labels = torch.empty(c.batch_size, dtype=torch.int64, device=self.comm)
            dist.recv(labels, self.owner[0])
        if labels is not None:
            labels = labels.to(self.device)
        losses: list[torch.Tensor] = []
        start = time.perf_counter()
        if self.first and self.last:
            self.schedule.step(images.to(self.device), target=labels, losses=losses)
        elif self.first:
            self.schedule.step(images.to(self.device))
        elif self.last:
            self.schedule.step(target=labels, losses=losses)
        else:
            self.schedule.step()
        pipe_s = time.perf_counter() - start
        if c.dp > 1:
            for p in self.params:
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.dp_group)
                    p.grad /= c.dp
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        busy = sum(s.take_busy() for s in self.stages)
        loss = float(sum(x.item() for x in losses) / len(losses)) if losses else 0.0
        return loss, pipe_s, busy

    def evaluate(self) -> float:
        """Top-1 accuracy of the held-out split through the stages; -1.0 without one."""
        has = torch.tensor([1 if self.eval_feed is not None else 0], device=self.comm)
        dist.broadcast(has, self.base, group=self.pp_group)
        if not int(has):
            return -1.0
        for m in self.modules.values():
            m.eval()
        feed: Any = self.eval_feed
        correct, total = torch.zeros(2, dtype=torch.float64), iter(feed) if self.first else None
        while True:
            batch = next(total, None) if total is not None else None
            flag = torch.tensor([0 if (self.first and batch is None) else 1], device=self.comm)
            dist.broadcast(flag, self.base, group=self.pp_group)
            if not int(flag):
                break
            x, y = (batch[0].to(self.device), batch[1]) if batch is not None else (None, torch.empty(0))
            if self.first and not self.last:  # the length first: the last evaluation batch may be short
                dist.send(torch.tensor([len(y)], device=self.comm), self.owner[-1])
                dist.send(y.to(self.comm), self.owner[-1])
            elif self.last and not self.first:
                n = torch.zeros(1, dtype=torch.int64, device=self.comm)
                dist.recv(n, self.owner[0])
                y = torch.empty(int(n), dtype=torch.int64, device=self.comm)
                dist.recv(y, self.owner[0])
            y = y.cpu()
            logits = chain_forward(self.modules, self.config.model_stages, self.owner, self.rank, x, self.device)
            if self.last:
                correct += torch.tensor([(logits.argmax(1).cpu() == y).sum().item(), len(y)], dtype=torch.float64)
        for m in self.modules.values():
            m.train()
        correct = correct.to(self.comm)
        dist.all_reduce(correct, group=self.pp_group)
        return float(correct[0] / correct[1]) if correct[1] else 0.0


def _worker(rank: int, configs: list[TrainConfig], port: int | None, local_rank: int | None) -> None:
    first = configs[0]
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(first.world_size), LOCAL_RANK=str(rank))
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(first.threads or max(1, cores // max(1, min(first.world_size, cores))))
    backend = "nccl" if first.device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=first.world_size,
                            timeout=datetime.timedelta(seconds=first.timeout_s))
    try:
        for config in configs:
            _run(rank, config, local_rank if local_rank is not None else rank)
    finally:
        dist.destroy_process_group()


def _run(rank: int, c: TrainConfig, local_rank: int) -> None:
    job = _Job(rank, c, local_rank)
    job.build()
    step, start_epoch = job.restore() if c.resume else (0, 0)
    out = Path(c.out_dir)
    report = Report(out, c.stages, c.dp, c.progress and rank == 0, c.log_every, append=c.resume) \
        if rank == 0 else None
    total_steps = c.epochs * job.steps_per_epoch if c.max_steps is None else min(c.max_steps,
                                                                                  c.epochs * job.steps_per_epoch)
    wall0, accuracy, epoch = time.perf_counter(), None, start_epoch
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
            loss, pipe_s, busy = job.train_step(images, labels)
            step += 1
            if c.crash_at is not None and tuple(c.crash_at) == (rank, step):
                os.kill(os.getpid(), 9)
            stats = torch.tensor([loss if job.last else 0.0, wait if job.first else 0.0, busy,
                                  pipe_s if job.first else 0.0], device=job.comm)
            dist.all_reduce(stats, group=job.pp_group)
            if report is not None:
                report.step(step, epoch, float(stats[0]), float(stats[1]), float(stats[3]), float(stats[2]),
                            c.batch_size)
            if c.checkpoint_every and step % c.checkpoint_every == 0 and step < total_steps:
                job.save(step, epoch if step % job.steps_per_epoch else epoch + 1)
        accuracy = job.evaluate()
        if report is not None:
            report.eval(epoch, step, accuracy) if accuracy >= 0 else report.close_bar()
    end_epoch = epoch + 1 if step % job.steps_per_epoch == 0 else epoch
    job.save(step, end_epoch)
    job.clock.dump(out / f"spans-{rank}.json")
    dist.barrier()
    if report is not None:
        wall = time.perf_counter() - wall0
        summary = {"model": c.model, "stages": c.stages, "model_stages": c.model_stages, "replicas": c.dp,
                   "schedule": c.schedule, "microbatches": c.microbatches, "balance": list(job.balance),
                   "steps": step, "wall_s": wall, "final_loss": report.last_loss,
                   "eval_top1": accuracy if accuracy is not None and accuracy >= 0 else None,
                   "bubble_theory": theoretical_bubble(c.schedule, c.stages, c.microbatches, c.virtual_stages),
                   "num_classes": job.num_classes, "checkpoint": str(ckpt.step_dir(c.ckpt_root, step)),
                   "config": {k: v for k, v in asdict(c).items() if k != "crash_at"}, **report.fractions()}
        report.close()
        merged = StageClock()
        for r in range(c.world_size):
            merged.merge(out / f"spans-{r}.json")
        merged.to_chrome_trace(out / "trace.json")
        summary["trace"] = str(out / "trace.json")
        ckpt.atomic_write_bytes(out / "summary.json", json.dumps(summary, indent=1, default=str).encode())
        if c.progress:
            print(format_summary(summary), flush=True)


def demo_config(train_dir: str, eval_dir: str, out_dir: str, *, epochs: int = 6, progress: bool = True) -> TrainConfig:
    """The demo's job: a small CNN in 2 stages with 1F1B on a synthetic ImageFolder, sized for a 2-core CPU.

    With ``make_image_folder(train_dir, num_classes=4, per_class=150, size=(48, 48))`` and a held-out folder of
    another seed it reaches well above the 25% of chance in about 15 s of training on 2 cores.
    """
    return TrainConfig(model="small_cnn", data=train_dir, eval_data=eval_dir, image_size=32, batch_size=32,
                       microbatches=4, stages=2, schedule="1f1b", epochs=epochs, lr=0.01, out_dir=out_dir,
                       progress=progress)
