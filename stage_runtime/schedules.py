"""The pipeline schedules as a table: one :class:`ScheduleSpec` per name.

The trainer, the planner (``plan/orders.py``, ``plan/planner.py``, ``plan/calibrate.py``), ``stallfree bench`` and
the docs read it (``docs/train.md``'s table is checked against it); nothing else branches on a schedule's name, so
a schedule is added here alone: its torch class, placement, stages per rank and family are what the others read
(``tests/stage_runtime/plan/test_schedule_table.py`` adds one). Every schedule but ``2bw`` flushes (a step ends with
every micro-batch's backward done). ``2bw`` (PipeDream-2BW) runs 1F1B's order over the micro-batches of consecutive
steps without a flush, on stallfree's own runner (``train/two_bw.py``): the planner leaves it out of its ranking
(:data:`FLUSHING`) and simulates it apart (``plan/asynchronous.py``), beside the best 1F1B plan.

With S ranks, M micro-batches and V stages per rank (``F``: a forward, ``B``: a backward, ``.``: idle)::

    GPipe, S=2, M=3                     1F1B, S=2, M=3
    rank0: F0 F1 F2 .  .  B0 B1 B2      rank0: F0 F1 .  B0 F2 B1 .  B2
    rank1: .  F0 F1 F2 B0 B1 B2 .       rank1: .  F0 B0 F1 B1 F2 B2 .

Both leave each rank idle for (S-1) of its M+S-1 slots: bubble (S-1)/(M+S-1) (1F1B holds fewer activations).
Interleaving (loop placement: stage s on rank s % S) divides the warm-up by V: (S-1)/(V*M+S-1). Zero-bubble
schedules split backward into input- and weight-gradients and fill the bubble with the latter; their ideal is 0.
ZBV places stages in a V: rank r holds stages r and 2S-1-r, so rank 0 holds both the first and the last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch is imported where a schedule is built: `stallfree --help` imports no torch
    from torch.distributed.pipelining.schedules import _PipelineSchedule

__all__ = [
    "SCHEDULES",
    "FLUSHING",
    "SCHEDULE_SPECS",
    "ScheduleName",
    "ScheduleSpec",
    "build_schedule",
    "schedule_spec",
]

ScheduleName = Literal["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "zbv", "2bw"]


@dataclass(frozen=True)
class ScheduleSpec:
    """What stallfree needs to know of one schedule.

    torch's class is named, and looked up only when a schedule is built: importing ``torch.distributed.pipelining``
    takes seconds, and ``--help`` and the config checks need none of it.
    """

    name: ScheduleName
    torch_class: str  # the class in torch.distributed.pipelining (for 2bw: the order it runs, 1F1B's)
    placement: Literal["one", "loop", "v"]  # one stage per rank; stage s on rank s % S; rank r holds r and 2S-1-r
    stages_fixed: int | None  # stages per rank, or None: --virtual-stages
    microbatches_per_rank: bool  # torch requires M to be a multiple of the pipeline ranks
    bubble_theory: Literal["(S-1)/(M+S-1)", "(S-1)/(V*M+S-1)", "0"]  # the ideal with equal stage times, S ranks
    # How torch runs it, so how its order is read and its host overhead calibrated: "loop", a hand-written loop
    # over the rank's one stage (``_step_microbatches``); "runtime", the action-list runtime of multi-stage schedules
    # (``pipeline_order_with_comms``). The names are calibration.json's keys.
    family: Literal["loop", "runtime"]
    min_ranks: int = 1
    # False: no flush between steps; stallfree's runner (two_bw.py) keeps micro-batches in flight across steps
    flush: bool = True

    def __post_init__(self) -> None:
        if (self.family == "loop") != (self.placement == "one"):
            raise ValueError(f"schedule {self.name!r}: torch runs a loop over one stage per rank and an action list "
                             f"over several, got family {self.family!r} with placement {self.placement!r}")

    def stages_per_rank(self, virtual: int = 2) -> int:
        """How many stages each rank holds: fixed by the schedule, else ``virtual`` (``--virtual-stages``)."""
        if self.stages_fixed is not None:
            return self.stages_fixed
        if virtual < 1:
            raise ValueError(f"--virtual-stages must be >= 1, got {virtual}")
        return virtual

    def owner(self, stage: int, ranks: int) -> int:
        """The pipeline rank that runs global ``stage``."""
        if self.placement == "v":
            return stage if stage < ranks else 2 * ranks - 1 - stage
        return stage % ranks

    def bubble(self, ranks: int, microbatches: int, virtual: int = 2) -> float:
        """The idle share of the ideal schedule with equal stage times.

        For the zero-bubble schedules it is their ideal, 0, not torch's exact plan.
        """
        if ranks <= 1 or self.bubble_theory == "0":
            return 0.0
        v = 1 if self.bubble_theory == "(S-1)/(M+S-1)" else self.stages_per_rank(virtual)
        return (ranks - 1) / (v * microbatches + ranks - 1)

    def check(self, ranks: int, microbatches: int) -> None:
        """Reject the rank and micro-batch counts this schedule cannot run, with the fix.

        Raises:
            ValueError: fewer ranks than the schedule needs, or ``M`` not a multiple of the ranks where torch
                requires it.
        """
        if microbatches < 1:
            raise ValueError(f"--microbatches must be >= 1, got {microbatches}")
        if ranks < self.min_ranks:
            raise ValueError(f"schedule {self.name!r} needs at least {self.min_ranks} pipeline ranks "
                             f"(--stages {self.min_ranks}), got {ranks}")
        if self.microbatches_per_rank and ranks > 1 and microbatches % ranks:
            raise ValueError(f"schedule {self.name!r} needs --microbatches to be a multiple of the {ranks} pipeline "
                             f"ranks, got {microbatches}; use {ranks * max(1, round(microbatches / ranks))}")
        if not self.flush and microbatches < ranks - 1:
            # rank 0 keeps S-1 micro-batches in flight across the update: more than M of them would read a third
            # weight version (PipeDream-2BW keeps two: M >= S-1)
            raise ValueError(f"schedule {self.name!r} keeps two weight versions only with --microbatches >= "
                             f"pipeline ranks - 1; got {microbatches} micro-batches for {ranks} ranks: use "
                             f"--microbatches {ranks - 1} or more")

    def runs(self, ranks: int, microbatches: int) -> bool:
        """Whether :meth:`check` accepts these counts (a sweep skips the others)."""
        try:
            self.check(ranks, microbatches)
        except ValueError:
            return False
        return True


SCHEDULE_SPECS: dict[str, ScheduleSpec] = {s.name: s for s in (
    ScheduleSpec("gpipe", "ScheduleGPipe", "one", 1, False, "(S-1)/(M+S-1)", "loop"),
    ScheduleSpec("1f1b", "Schedule1F1B", "one", 1, False, "(S-1)/(M+S-1)", "loop"),
    ScheduleSpec("interleaved-1f1b", "ScheduleInterleaved1F1B", "loop", None, True, "(S-1)/(V*M+S-1)", "runtime"),
    ScheduleSpec("zero-bubble", "ScheduleInterleavedZeroBubble", "loop", None, True, "0", "runtime"),
    ScheduleSpec("zbv", "ScheduleZBVZeroBubble", "v", 2, False, "0", "runtime", min_ranks=2),
    ScheduleSpec("2bw", "Schedule1F1B", "one", 1, False, "0", "loop", flush=False),
)}
SCHEDULES: tuple[str, ...] = tuple(SCHEDULE_SPECS)
# The schedules whose step ends with every backward done: the ones the planner ranks and simulates step by step.
FLUSHING: tuple[str, ...] = tuple(name for name, spec in SCHEDULE_SPECS.items() if spec.flush)


def schedule_spec(name: str) -> ScheduleSpec:
    """The spec of schedule ``name``.

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    if name not in SCHEDULE_SPECS:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_SPECS)}")
    return SCHEDULE_SPECS[name]


def build_schedule(name: str, stages: list, microbatches: int, loss_fn: Callable) -> _PipelineSchedule:
    """The torch schedule object for this rank's ``stages`` (a list of ``PipelineStage``): its ``step`` runs one.

    Raises:
        ValueError: a schedule without a flush (``2bw``): ``two_bw.TwoBW`` runs it, not torch.
    """
    from torch.distributed import pipelining

    spec = schedule_spec(name)
    if not spec.flush:
        raise ValueError(f"schedule {name!r} does not flush: stallfree.stage_runtime.train.two_bw.TwoBW runs it, "
                         "not a torch schedule")
    cls = getattr(pipelining, spec.torch_class)
    # The one-stage-per-rank classes take the stage itself, the others the list of the rank's stages.
    return cls(stages[0] if spec.placement == "one" else stages, microbatches, loss_fn=loss_fn)
