"""The pipeline schedules by name: the ``torch.distributed.pipelining`` class, stage placement, theory.

With P ranks, M micro-batches and V stages per rank (``F``: a forward, ``B``: a backward, ``.``: idle)::

    GPipe, P=2, M=3                     1F1B, P=2, M=3
    rank0: F0 F1 F2 .  .  B0 B1 B2      rank0: F0 F1 .  B0 F2 B1 .  B2
    rank1: .  F0 F1 F2 B0 B1 B2 .       rank1: .  F0 B0 F1 B1 F2 B2 .

Both leave each rank idle for (P-1) of its M+P-1 slots: bubble (P-1)/(M+P-1) (1F1B holds fewer activations).
Interleaving (loop placement: stage s on rank s % P) divides the warm-up by V: (P-1)/(V*M+P-1). Zero-bubble
schedules split backward into input- and weight-gradients and fill the bubble with the latter; their ideal is 0.
ZBV places stages in a V: rank r holds stages r and 2P-1-r, so rank 0 holds both the first and the last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

__all__ = [
    "SCHEDULES",
    "ScheduleName",
    "build_schedule",
    "check_microbatches",
    "stage_owner",
    "stages_per_rank",
    "theoretical_bubble",
]

ScheduleName = Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv")

# torch's class per name, looked up only when a schedule is built: importing torch.distributed.pipelining takes
# seconds, and `stallfree --help` and the config checks need only the names.
_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zero-bubble": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
}


def _check(name: str) -> None:
    if name not in _CLASSES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")


def stages_per_rank(name: str, virtual: int = 2) -> int:
    """How many stages each rank holds: 1 for GPipe/1F1B, ``virtual`` for the looped ones, 2 for ZBV."""
    _check(name)
    if name in ("gpipe", "1f1b"):
        return 1
    if name == "zbv":
        return 2
    if virtual < 1:
        raise ValueError(f"--virtual-stages must be >= 1, got {virtual}")
    return virtual


def stage_owner(name: str, stage: int, ranks: int) -> int:
    """The pipeline rank that runs global ``stage`` (loop placement, or V placement for ZBV)."""
    _check(name)
    if name == "zbv":
        return stage if stage < ranks else 2 * ranks - 1 - stage
    return stage % ranks


def theoretical_bubble(name: str, ranks: int, microbatches: int, virtual: int = 2) -> float | None:
    """The idle share of the ideal schedule with equal stage times; ``None`` where torch's plan has no closed form.

    Zero-bubble schedules are 0 in the ideal with equal F, B and W times; 0.0 is returned for them.
    """
    _check(name)
    if ranks <= 1:
        return 0.0
    if name in ("gpipe", "1f1b"):
        return (ranks - 1) / (microbatches + ranks - 1)
    if name == "interleaved-1f1b":
        v = stages_per_rank(name, virtual)
        return (ranks - 1) / (v * microbatches + ranks - 1)
    return 0.0


def check_microbatches(name: str, ranks: int, microbatches: int) -> None:
    """Reject micro-batch counts a schedule cannot run, with the fix.

    Raises:
        ValueError: the looped schedules need ``M`` to be a multiple of the ranks (torch's requirement).
    """
    _check(name)
    if microbatches < 1:
        raise ValueError(f"--microbatches must be >= 1, got {microbatches}")
    if name in ("interleaved-1f1b", "zero-bubble") and ranks > 1 and microbatches % ranks:
        raise ValueError(f"schedule {name!r} needs --microbatches to be a multiple of the {ranks} pipeline ranks, "
                         f"got {microbatches}; use {ranks * max(1, round(microbatches / ranks))}")


def build_schedule(name: str, stages: list, microbatches: int, loss_fn: Callable) -> object:
    """The torch schedule object for this rank's ``stages`` (a list of ``PipelineStage``)."""
    from torch.distributed import pipelining

    _check(name)
    cls = getattr(pipelining, _CLASSES[name])
    if name in ("gpipe", "1f1b"):
        return cls(stages[0], microbatches, loss_fn=loss_fn)
    return cls(stages, microbatches, loss_fn=loss_fn)
