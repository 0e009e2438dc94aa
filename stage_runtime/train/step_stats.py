"""Each step's figures, gathered over a pipeline's ranks one step late, for the report.

Every rank posts its figures of step ``k`` (``[loss, input wait, busy, t0, start, end, work, padding]``: the last
stage's loss, stage 0's wait for its batch, the rank's busy seconds, ``time.perf_counter`` before the batch was read
and at the start and end of its schedule step, and stage 0's batch's work and padding slots) in an ``all_gather``
(over every replica's ranks with ``--dp N``: the slowest replica's end is the step's) with ``async_op=True``, and
waits for step
``k-1``'s only then, long after every rank posted it. A blocking collective after every step would be a barrier
across the pipeline: under ``2bw`` at S>=3 (no instant ends every rank's part of a step) and under the
zero-bubble schedules (the other ranks still run weight gradients when rank 0 is done) it idles ranks.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from stallfree.stage_runtime.train.rank import Rank
from stallfree.stage_runtime.train.report import Report

__all__ = ["StepStats"]


class StepStats:
    """Each step's figures, gathered over the pipeline ranks one step late: no collective waits between steps.

    Before anything that needs every rank (checkpoint, evaluation, the end) :meth:`settle` waits for the last one.
    Pipeline rank 0 hands the gathered figures to the :class:`Report`, each step once and in order.
    """

    def __init__(self, job: Rank, report: Report | None):
        self.job, self.report = job, report
        # The pipeline's step is timed across its ranks on perf_counter, which only the processes of one machine
        # share; a job across machines times it on pipeline rank 0 alone.
        local = os.environ.get("LOCAL_WORLD_SIZE")
        self.one_clock = local is None or int(local) >= job.config.pipeline.world_size
        self._pending: tuple[Any, list[torch.Tensor], int, int, float] | None = None

    def post(self, step: int, epoch: int, lr: float, figures: list[float]) -> None:
        """Post step ``step``'s figures, then wait for (and report) the step before it."""
        mine = torch.tensor(figures, dtype=torch.float64, device=self.job.comm)  # float64: perf_counter's seconds
        p = self.job.config.pipeline
        group = self.job.pp_group if p.dp == 1 else None  # None: every rank, replica 0's first (global rank order)
        every = [torch.zeros_like(mine) for _ in range(p.stages if p.dp == 1 else p.world_size)]
        work = dist.all_gather(every, mine, group=group, async_op=True)
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
        c = self.job.config
        every_rank = [[float(v) for v in t.cpu()] for t in every]
        rows = every_rank[:c.pipeline.stages]  # replica 0's, one per pipeline rank, in pipeline order
        ends = [r[5] for r in rows] if self.one_clock else [rows[0][5]]
        slowest = max(r[5] for r in every_rank) if self.one_clock and c.pipeline.dp > 1 else None
        firsts = every_rank[::c.pipeline.stages]  # each replica's stage 0: its batch's work and padding slots
        work = (rows[0][6], sum(r[6] for r in firsts) / len(firsts), sum(r[7] for r in firsts) / len(firsts))
        self.report.step(step, epoch, loss=sum(r[0] for r in rows), wait_s=rows[0][1], t0=rows[0][3],
                         start=rows[0][4], end=max(ends), busy_s=sum(r[2] for r in rows),
                         images=c.units_per_batch, lr=lr, replicas_end=slowest, work=work)
