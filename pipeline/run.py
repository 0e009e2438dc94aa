"""What a pass takes its batches from: the :class:`Run` protocol, one per placement of the graph.

An epoch run makes the batches of one pass over an epoch, in order, from a position of the rank's stream. The local
run (:class:`~stallfree.pipeline.epoch.EpochRun`: a reader thread and a graph thread in this process) and the Ray
run (:class:`~stallfree.pipeline.ray_run.RayRun`: batches made by Ray actors) implement it; a
:class:`~stallfree.pipeline.passes.Pass` and the Loader use nothing else of either.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from stallfree.pipeline.samples import Batch

__all__ = ["Clock", "Run"]


class Clock(Protocol):
    """Where a run reports its spans (``stallfree.stage_runtime.clock.StageClock`` is one)."""

    def record(self, stage: str, state: str, start: float, end: float, batch: int | None = None) -> None:
        """Record that ``stage`` was ``state`` ("busy" or "waiting") from ``start`` to ``end`` (perf_counter)."""


class Run(Protocol):
    """The batches of one pass, in order.

    Attributes:
        may_start_next: set once the next epoch's run may start (this run has read its epoch).
    """

    may_start_next: threading.Event

    def __iter__(self) -> Iterator[Batch]:
        """The batches in order; a sample's failure under ``on_error="raise"`` is raised here."""
        ...

    def stop(self) -> None:
        """Stop making batches; a partly consumed run can be abandoned at any time."""
        ...

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for what the run started in this process to end (after :meth:`stop`)."""
        ...

    @property
    def stopped(self) -> bool:
        """Whether the run is stopped."""
        ...

    def ready(self) -> bool:
        """Whether the next batch is made already, so that ``next`` only takes it (``bench stall`` splits waits so)."""
        ...

    def attach(self, clock: Clock | None) -> None:
        """Report the run's spans to ``clock`` from now on, and those it held until now (none to ``None``).

        A run reports to the clock of the pass that takes it: one started ahead holds its spans until then.
        """
        ...
