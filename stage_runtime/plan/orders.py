"""The order of operations each rank runs, taken from torch's own schedule objects so it cannot drift.

Which torch class, which way and on which placement come from the schedule's spec
(:mod:`stallfree.stage_runtime.schedules`), never from its name. ``torch.distributed.pipelining`` builds its
multi-stage schedules (the ``runtime`` family: interleaved 1F1B, zero-bubble, ZBV) from an action list per rank
(``pipeline_order_with_comms``, what its runtime executes); we read the compute actions from it. The single-stage
schedules (the ``loop`` family: GPipe, 1F1B) run hand-written loops (``_step_microbatches``) whose published
``pipeline_order`` does not match them in torch 2.13 (1F1B's last rank lists ``F1..F4`` for micro-batches ``0..3``),
so we run that loop itself with a stage that only records what it is asked to do. No process group is needed for
either: the schedules are built on stand-in stages that carry only their index and the group size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.schedules import ScheduleSpec, schedule_spec

__all__ = ["Op", "job_program", "placement", "torch_order"]


@dataclass(frozen=True)
class Op:
    """One operation of a rank on model ``stage`` and micro-batch ``mb``.

    ``kind``: F (forward), B (full backward), I (input gradient), W (weight gradient) or O (an optimizer update
    of the rank's stages).
    """

    stage: int
    kind: str
    mb: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


def placement(schedule: str, ranks: int, stages: int) -> list[int]:
    """The rank of each model stage, by the schedule's placement: stage s on rank s % ranks, or V-shaped (ZBV).

    Raises:
        ValueError: an unknown schedule; the message lists the known ones.
    """
    spec = schedule_spec(schedule)
    return [spec.owner(s, ranks) for s in range(stages)]


class _StandIn:
    """What a torch schedule reads from a ``PipelineStage`` while planning, and records what it runs."""

    def __init__(self, index: int, stages: int, ranks: int, rank: int):
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, stages, ranks, rank
        self.is_first, self.is_last = index == 0, False  # not last: the loop then asks for no loss
        self.has_backward, self.submod, self.device = True, None, "cpu"
        self.ran: list[Op] = []

    def get_fwd_recv_ops(self, *_: Any) -> list:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, mb: int, *_: Any, **__: Any) -> None:
        self.ran.append(Op(self.stage_index, "F", mb))

    def backward_one_chunk(self, mb: int, *_: Any, **__: Any) -> None:
        self.ran.append(Op(self.stage_index, "B", mb))

    def clear_runtime_states(self) -> None:
        pass

    def perform_reduce_grad(self, *_: Any) -> None:
        pass


def _single(cls: Any, ranks: int, microbatches: int) -> dict[int, list[Op]]:
    order = {}
    for rank in range(ranks):
        stage = _StandIn(rank, ranks, ranks, rank)
        schedule = cls(stage, microbatches, loss_fn=lambda *_: None)
        # Already "initialised": the loop then skips the shape inference that needs real tensors and peers.
        schedule._stage_forward_initialized = schedule._stage_backward_initialized = True
        schedule._step_microbatches()
        order[rank] = stage.ran
    return order


def _multi(cls: Any, spec: ScheduleSpec, ranks: int, per_rank: int, microbatches: int) -> dict[int, list[Op]]:
    stages = ranks * per_rank
    mine = [_StandIn(s, stages, ranks, 0) for s in range(stages) if spec.owner(s, ranks) == 0]
    built = cls(mine, microbatches, loss_fn=lambda *_: None)
    order = {}
    for rank, actions in built.pipeline_order_with_comms.items():
        ops: list[Op] = []
        for a in actions:
            for leaf in (a.sub_actions or (a,)) if a is not None else ():
                kind = leaf.computation_type.value
                if kind in ("F", "B", "I", "W"):
                    ops.append(Op(leaf.stage_index, kind, leaf.microbatch_index))
        order[rank] = ops
    return order


@lru_cache(maxsize=256)
def _cached(spec: ScheduleSpec, ranks: int, microbatches: int, virtual: int) -> tuple[tuple[Op, ...], ...]:
    # Keyed by the spec, not its name: a name given another spec is another order.
    from torch.distributed import pipelining  # lazy: `stallfree --help` must not import torch

    cls = getattr(pipelining, spec.torch_class)
    if spec.family == "loop":
        order = _single(cls, ranks, microbatches)
    else:
        order = _multi(cls, spec, ranks, spec.stages_per_rank(virtual), microbatches)
    return tuple(tuple(order[r]) for r in range(ranks))


def torch_order(schedule: str, ranks: int, microbatches: int, virtual: int = 2) -> dict[int, list[Op]]:
    """Each rank's compute operations, in the order torch's schedule ``schedule`` runs them.

    ``virtual`` is the stages per rank of the schedules that leave it free (``ScheduleSpec.stages_fixed`` None:
    interleaved-1f1b and zero-bubble); the others have their own (ZBV 2, GPipe/1F1B 1).

    Raises:
        ValueError: an unknown schedule (the message lists the known ones), or a combination torch refuses (its
            message), e.g. 1F1B with fewer micro-batches than ranks.
    """
    if ranks < 1 or microbatches < 1 or virtual < 1:
        raise ValueError(f"ranks, micro-batches and virtual stages must be >= 1, got {ranks}, {microbatches}, "
                         f"{virtual}")
    return {r: list(ops) for r, ops in enumerate(_cached(schedule_spec(schedule), ranks, microbatches, virtual))}


def job_program(config: TrainConfig) -> tuple[dict[int, list[Op]], list[int]]:
    """What each rank of ``config``'s job (a ``TrainConfig``) runs, in torch's order, and each model stage's rank."""
    per_rank = config.pipeline.spec.stages_per_rank(config.pipeline.virtual_stages)
    return (torch_order(config.pipeline.schedule, config.pipeline.stages, config.pipeline.microbatches, per_rank),
            placement(config.pipeline.schedule, config.pipeline.stages, config.pipeline.model_stages))
