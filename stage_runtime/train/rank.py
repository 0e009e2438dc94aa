"""One rank of a training job: its process groups, stages, schedule, optimizer, feeds, step and checkpoint.

The trainer (:mod:`stallfree.stage_runtime.train.trainer`) runs the loop; this is what each step and save does on
one rank (its evaluation: :mod:`.evaluation`). Global rank = replica x stages + pipeline rank; every rank builds the
whole model from the seed, so all processes start from the same weights, and keeps the stage(s) it owns.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.measure import measure_model
from stallfree.stage_runtime.models.partition import LayerCost, plan
from stallfree.stage_runtime.models.tasks import Batch, make_task
from stallfree.stage_runtime.models.zoo import build_model
from stallfree.stage_runtime.schedules import build_schedule
from stallfree.stage_runtime.stage import SimulatedCompute, TimedStage
from stallfree.stage_runtime.stage_times import stage_times
from stallfree.stage_runtime.train import checkpoint as ckpt
from stallfree.stage_runtime.train.feed import Feeds, build_feeds
from stallfree.stage_runtime.train.optim import build_optimizer, build_scheduler
from stallfree.stage_runtime.train.two_bw import TwoBW

__all__ = ["Rank"]


def _stage_shapes(layers: list[nn.Module], bounds: list[int], x: torch.Tensor) -> list[tuple[Any, Any]]:
    """Each stage's (input, output) as meta tensors, from a forward of a meta copy of the model on ``x``.

    ``x``: stage 0's input of one micro-batch, on ``"meta"`` (``Task.example``). Giving the shapes to
    ``PipelineStage`` skips its runtime shape inference, which runs the stages' forward on uninitialised buffers and
    so writes NaN into BatchNorm's running statistics of every stage but the first.
    """
    meta = [copy.deepcopy(layer).to("meta") for layer in layers]
    shapes = []
    with torch.no_grad():
        for s in range(len(bounds) - 1):
            inp = x
            for layer in meta[bounds[s]:bounds[s + 1]]:
                x = layer(x)
            # requires_grad says which tensors carry a gradient back: all activations, not stage 0's input.
            shapes.append((inp.detach().requires_grad_(s > 0), x.detach().requires_grad_(True)))
    return shapes


class Rank:
    """One rank's view of the job: groups, its stages, schedule, optimizer, feeds, and the task they serve.

    ``task`` (:mod:`stallfree.stage_runtime.models.tasks`) turns the feed's items into batches and scores the last
    stage's output: the same on every rank, from the job's model and its outputs (classes or vocabulary).
    """

    def __init__(self, rank: int, config: TrainConfig, local_rank: int):
        self.config, p = config, config.pipeline
        self.rank, self.pp, self.replica = rank, rank % p.stages, rank // p.stages
        self.local_rank = local_rank
        cuda = config.processes.device.startswith("cuda")
        self.device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(self.device)
        self.comm = self.device if cuda else torch.device("cpu")  # NCCL sends CUDA tensors, gloo CPU ones
        # Every rank must create every group, in the same order; each with the job's timeout (a group's own
        # default is 30 minutes, whatever the default group was given), so a hung peer fails the job.
        timeout = datetime.timedelta(seconds=config.processes.timeout_s)
        self.pp_group = self.dp_group = None
        for d in range(p.dp):
            g = dist.new_group([d * p.stages + pp for pp in range(p.stages)], timeout=timeout)
            if d == self.replica:
                self.pp_group = g
        for pp in range(p.stages):
            g = dist.new_group([d * p.stages + pp for d in range(p.dp)], timeout=timeout)
            if pp == self.pp:
                self.dp_group = g
        self.base = self.replica * p.stages  # global rank of this replica's pipeline rank 0
        self.owner = [self.base + p.owner(s) for s in range(p.model_stages)]
        self.clock = StageClock()
        self._labels_sent: tuple[Any, torch.Tensor] | None = None  # stage 0's last labels isend, until it is done
        self.feeds: Feeds | None = None  # pipeline rank 0's
        info = torch.zeros(2, dtype=torch.int64, device=self.comm)
        if self.pp == 0:
            self.feeds = build_feeds(config, self.replica, str(self.device), self.clock)
            info[0] = len(self.feeds.train)
            info[1] = self.feeds.outputs
        dist.broadcast(info, self.base, group=self.pp_group)
        self.steps_per_epoch, self.num_classes = int(info[0]), int(info[1])  # classes, or a token model's vocabulary
        m = config.model
        self.task = make_task(m.kind, image_size=m.image_size, seq_len=m.packed_len, outputs=self.num_classes,
                              cost=m.cost, patch=m.vision)

    def build(self) -> None:
        """Plan the split (measured on global rank 0), build this rank's stages, schedule and optimizer."""
        c, p = self.config, self.config.pipeline
        torch.manual_seed(c.seed)
        size = c.model.image_size
        layers = list(build_model(c.model.name, self.num_classes, size, **c.model.factory_kwargs()))
        micro = p.micro_batch
        accelerator = c.simulation.accelerator  # a SimAccelerator, parsed by TrainConfig (None: the real device)
        balance = p.balance
        last = ckpt.latest(c.ckpt_root) if c.checkpoint.resume and p.balance is None and self.rank == 0 else None
        if last is not None:
            balance = tuple(ckpt.load_meta(c.ckpt_root, last)["balance"])
            if c.report.progress:
                print(f"split: balance {','.join(map(str, balance))} (from the checkpoint)", file=sys.stderr,
                      flush=True)
        # [balance, each model stage's measured cost (for the simulated device)]
        chosen: list[Any] = [balance, None]
        self.layer_costs: dict[str, Any] | None = None  # rank 0's measurement, for the report's prediction
        if self.rank == 0 and (balance is None or accelerator is not None):
            # One measurement serves the split and the plan simulator's prediction in the summary.
            times, optimizer_s = measure_model(nn.Sequential(*layers), size, micro, sample=self.task.example(micro))
            costs = [LayerCost(t.forward_s + t.backward_s, t.param_bytes, t.activation_bytes, t.forward_s, t.weight_s)
                     for t in times]
            partition = plan(layers, p.model_stages, balance=balance, costs=costs)
            if c.report.progress and balance is None:
                print(partition.describe(), file=sys.stderr, flush=True)
            chosen = [partition.balance, partition.stage_time_s]
            self.layer_costs = {"layers": [dataclasses.asdict(t) for t in times], "optimizer_s": optimizer_s}
        dist.broadcast_object_list(chosen, 0)
        self.balance = tuple(chosen[0])
        bounds = [sum(self.balance[:i]) for i in range(len(self.balance) + 1)]
        self.modules: dict[int, nn.Module] = {s: nn.Sequential(*layers[bounds[s]:bounds[s + 1]]).to(self.device)
                                              for s in range(p.model_stages) if self.owner[s] == self.rank}
        shapes = _stage_shapes(layers, bounds, self.task.example(micro, "meta"))
        sim: list[Any] = [None] * p.model_stages
        if accelerator is not None:  # each chunk scales its stage's times to its own micro-batch's work
            sim = [dataclasses.replace(t, work=micro) for t in stage_times(accelerator, micro, chosen[1])]
            last = p.model_stages - 1
            self.modules = {s: SimulatedCompute(m, shapes[s][1].shape[1:], work=self.task.work,
                                                carry=None if s == last else self.task.passed_on)
                            for s, m in self.modules.items()}
        params = [p for m in self.modules.values() for p in m.parameters()]
        # A rank whose stages hold no parameters (a Flatten alone) has nothing to step; torch refuses an empty list.
        o = c.optimizer
        self.optimizer = (build_optimizer(params, o.name, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
                          if params else None)
        self.scheduler = (build_scheduler(self.optimizer, total=c.steps.total(self.steps_per_epoch),
                                          warmup=o.warmup_steps, schedule=o.lr_schedule) if self.optimizer else None)
        self.stages: list[TimedStage] = []
        self.two_bw: TwoBW | None = None  # --schedule 2bw: stallfree's no-flush runner instead of torch's schedule
        if not p.spec.flush:
            (s, m), = self.modules.items()  # one stage per rank
            self.two_bw = TwoBW(m, s, prev=self.owner[s - 1] if s > 0 else None,
                                next=self.owner[s + 1] if s < p.model_stages - 1 else None,
                                microbatches=p.microbatches, ranks=p.stages, input_shape=tuple(shapes[s][0].shape),
                                output_shape=tuple(shapes[s][1].shape), device=self.device, comm=self.comm,
                                group=self.pp_group, optimizer=self.optimizer, update=self._update,
                                loss_fn=self.task.loss, clock=self.clock, sim=sim[s])
            return
        self.stages = [TimedStage(m, s, p.model_stages, self.device, input_args=shapes[s][0],
                                  output_args=shapes[s][1], group=self.pp_group, clock=self.clock, sim=sim[s],
                                  delay_s=self._delay_s(s))
                       for s, m in self.modules.items()]
        self.schedule = build_schedule(p.schedule, self.stages, p.microbatches, self.task.loss)

    def _delay_s(self, stage: int) -> tuple[float, float]:
        """``--link-delay``'s latency of model stage ``stage``'s links: (to the next stage's rank, to the previous)."""
        p, delay = self.config.pipeline, self.config.simulation.link_delay  # a LinkDelay, parsed by TrainConfig
        if delay is None:
            return 0.0, 0.0
        pp = [p.owner(s) for s in range(p.model_stages)]
        return (delay.seconds(pp[stage], pp[stage + 1]) if stage + 1 < len(pp) else 0.0,
                delay.seconds(pp[stage], pp[stage - 1]) if stage > 0 else 0.0)

    @property
    def first(self) -> bool:
        return self.owner[0] == self.rank

    @property
    def last(self) -> bool:
        return self.owner[-1] == self.rank

    def sync_running_stats(self) -> None:
        """Average the BatchNorm running statistics over the replicas (each saw only its shard's batches).

        Called before every evaluation and every checkpoint. The running mean and variance are exponential
        averages, linear in the batch statistics, and every replica starts from the same values, so averaging
        now equals having averaged after every step: the result does not depend on when it is done.
        """
        if self.config.pipeline.dp == 1:
            return
        buffers = [b for m in self.modules.values() for sub in m.modules()
                   for b in (getattr(sub, "running_mean", None), getattr(sub, "running_var", None))
                   if isinstance(b, torch.Tensor) and b.is_floating_point()]
        if not buffers:
            return
        flat = torch.cat([b.reshape(-1) for b in buffers]).to(self.comm)
        dist.all_reduce(flat, group=self.dp_group)
        flat /= self.config.pipeline.dp
        offset = 0
        for b in buffers:
            b.copy_(flat[offset:offset + b.numel()].view_as(b))
            offset += b.numel()

    def save(self, step: int, epoch: int) -> None:
        """Every rank saves its file; after a barrier each machine's first rank writes the manifest.

        The manifest (``meta.json``, ``latest.json``) goes beside the rank files on every machine, so a run
        whose ``--out`` is not shared keeps a complete, resumable checkpoint on each node (its own ranks' files);
        on a shared folder the writers write the same bytes, each by an atomic rename. Under ``2bw`` the pipeline
        is drained first, so the checkpoint holds one weight version and no micro-batch in flight.
        """
        self.drain()
        self.sync_running_stats()
        c = self.config
        state = {"modules": {str(s): m.state_dict() for s, m in self.modules.items()},
                 "optimizer": self.optimizer.state_dict() if self.optimizer else {}, "torch_rng": torch.get_rng_state(),
                 "scheduler": self.scheduler.state_dict() if self.scheduler else {},
                 "feed": json.dumps(self.feeds.train.state_dict()) if self.feeds is not None else ""}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        ckpt.save_rank(c.ckpt_root, step, self.rank, state)
        dist.barrier()
        if self.local_rank == 0:
            ckpt.save_meta(c.ckpt_root, step, ckpt.manifest(c, step, epoch, self.balance, self.num_classes))
            ckpt.prune(c.ckpt_root, c.checkpoint.keep)
        dist.barrier()

    def restore(self) -> tuple[int, int]:
        """Load the latest checkpoint; returns ``(step, epoch)`` to continue from (``(0, 0)`` without one)."""
        c = self.config
        step = ckpt.latest(c.ckpt_root)
        steps = [None] * c.pipeline.world_size
        dist.all_gather_object(steps, step)
        if len(set(steps)) > 1:
            where = ", ".join(f"rank {r}: {'none' if s is None else f'step {s}'}" for r, s in enumerate(steps))
            raise FileNotFoundError(f"--resume: the ranks see different checkpoints under {c.ckpt_root} ({where}); "
                                    "give every machine the checkpoint folder it saved (its own --out)")
        if step is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {c.ckpt_root} (no latest.json)")
        ckpt.check_job(c.ckpt_root, step, c, self.num_classes)  # the parent compared all but the dataset's classes
        meta = ckpt.load_meta(c.ckpt_root, step)
        if tuple(meta["balance"]) != self.balance:
            raise ValueError(f"checkpoint was saved with balance {meta['balance']}, this run splits "
                             f"{list(self.balance)}; pass --balance {','.join(map(str, meta['balance']))}")
        state = ckpt.load_rank(c.ckpt_root, step, self.rank)
        for s, m in self.modules.items():
            m.load_state_dict(state["modules"][str(s)])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler"):  # checkpoints before the schedule have none
            self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        if self.feeds is not None and state["feed"]:
            self.feeds.train.load_state_dict(json.loads(state["feed"]))
        return step, int(meta["epoch"])

    def train_step(self, batch: Batch | None) -> tuple[float, float, float, float]:
        """One optimizer step; returns ``(summed micro-batch loss or 0, schedule start, its end, busy seconds)``.

        ``batch``: stage 0's (``None`` on the other ranks). Start and end are ``time.perf_counter`` readings. The
        targets go from stage 0 to the last stage by ``isend`` (stage 0 does not wait for the last stage to reach
        this step) and ``irecv``, in posting order per pair.
        """
        inputs: Any = batch.inputs if batch is not None else None
        labels: Any = batch.targets if batch is not None else None
        for stage in self.stages:
            stage.step_number += 1
        target: Any = None  # the last stage's labels, or what waits for them
        if self.first and self.last:
            target = labels.to(self.device)
        elif self.first:
            labels = labels.to(self.comm)
            self._wait_labels_sent()
            self._labels_sent = (dist.isend(labels, self.owner[-1]), labels)  # the tensor lives until it is sent
        elif self.last:
            target = self._receive_labels()
        if self.two_bw is not None:
            return self._train_step_2bw(self.two_bw, inputs, target)
        if callable(target):
            target = target()
        losses: list[torch.Tensor] = []
        start = time.perf_counter()
        if self.first and self.last:
            self.schedule.step(inputs.to(self.device), target=target, losses=losses)
        elif self.first:
            self.schedule.step(inputs.to(self.device))
        elif self.last:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        end = time.perf_counter()
        self._update()
        busy = sum(s.take_busy() for s in self.stages)
        loss = float(sum(x.item() for x in losses) / len(losses)) if losses else 0.0
        return loss, start, end, busy

    def _receive_labels(self) -> Any:
        """Post the receive of this step's labels; returns what waits for them (on this rank's device)."""
        buf = torch.empty(self.task.target_shape(self.config.pipeline.batch_size), dtype=torch.int64,
                          device=self.comm)
        work = dist.irecv(buf, self.owner[0])
        if work is None:
            raise RuntimeError(f"rank {self.rank}: irecv of the labels from rank {self.owner[0]} returned no work")

        def labels() -> torch.Tensor:
            work.wait()
            return buf.to(self.device)
        return labels

    def _wait_labels_sent(self) -> None:
        if self._labels_sent is not None:
            self._labels_sent[0].wait()
            self._labels_sent = None

    def _update(self) -> None:
        """One optimizer update of this rank's stages, the gradients of the step's micro-batches in place."""
        for module in self.modules.values():
            if isinstance(module, SimulatedCompute):
                module.zero_grads()
        if self.config.pipeline.dp > 1:
            for p in (p for m in self.modules.values() for p in m.parameters()):  # 2bw replaces them: read anew
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.dp_group)
                    p.grad /= self.config.pipeline.dp
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()

    def _train_step_2bw(self, two_bw: TwoBW, inputs: Any, target: Any) -> tuple[float, float, float, float]:
        """As :meth:`train_step`, for ``--schedule 2bw``: the updates run inside the runner (one per M backwards).

        ``target``: on the last stage, the step's labels or what waits for them (read at the step's first forward
        that needs them). Nothing waits for the other ranks here: each rank's call ends at its own cut of the
        stream, and the trainer times the pipeline's step from every rank's start and end.
        """
        two_bw.step_number += 1
        losses: list[torch.Tensor] = []
        start = time.perf_counter()
        two_bw.step(inputs.to(self.device) if self.first else None, target, losses)
        end = time.perf_counter()
        loss = float(sum(x.item() for x in losses) / len(losses)) if losses else 0.0
        return loss, start, end, two_bw.take_busy()

    def drain(self) -> None:
        """Finish every micro-batch in flight (``--schedule 2bw``; the others flush at every step).

        Every rank calls it before the weights are read (evaluation, checkpoint); stage 0's labels sent are waited
        for too.
        """
        self._wait_labels_sent()
        if self.two_bw is not None:
            self.two_bw.drain()

    def weight_versions(self) -> dict[str, list[int]]:
        """Per pipeline rank (``2bw``): the most weight versions alive at once and the most stale gradient.

        Staleness counts the updates between the version a forward read and the update its gradient went into;
        ``{}`` for the other schedules.

        A collective over the pipeline group: every rank calls it.
        """
        if self.two_bw is None:
            return {}
        mine = torch.tensor([self.two_bw.versions.most_alive, self.two_bw.versions.most_stale], device=self.comm)
        every = [torch.zeros_like(mine) for _ in range(self.config.pipeline.stages)]
        dist.all_gather(every, mine, group=self.pp_group)
        return {"weight_versions": [int(t[0]) for t in every], "staleness_steps": [int(t[1]) for t in every]}
