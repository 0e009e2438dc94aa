"""The simulated accelerator's time per model stage: how a pipeline splits a device of ``R`` units of work a second.

``R`` (:class:`~stallfree.core.accelerator.SimAccelerator`) is the replica's compute rate: with no input wait and no
bubble, the pipeline would train ``R`` units of work per second. A micro-batch's *work* is its images, or for a token
model its documents' cost ``Cost(linear=1, quadratic=1/A).lengths(...)`` in tokens (``A``: ``--attention-span``;
:meth:`~stallfree.stage_runtime.models.tasks.Task.work`). The slowest model stage therefore takes ``w / R`` seconds
per micro-batch of work ``w``, and every other stage its measured share of that (the partitioner's forward +
backward time of its layers, over the slowest stage's). Each stage's time splits one third forward, one third
backward to the input, one third backward to the weights (the usual 1 : 1 : 1 of the zero-bubble paper); a schedule
that runs the backward whole waits for both thirds at once. What runs in place of the layers is
:class:`~stallfree.stage_runtime.stage.SimulatedCompute`: throughput under ``sim`` measures the input path and the
pipeline, not the model; losses under ``sim`` mean nothing. This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stallfree.core.accelerator import SimAccelerator

__all__ = ["StageTimes", "stage_times"]


@dataclass(frozen=True)
class StageTimes:
    """Seconds one model stage computes per micro-batch of ``work`` units on the simulated device."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float
    # the micro-batch work these times are for (images, or a token micro-batch's cost), which each micro-batch's are
    # scaled from by its own work; None: every micro-batch takes these times
    work: float | None = None

    def for_work(self, work: float) -> StageTimes:
        """The times of a micro-batch of ``work`` units: the device's time grows with the work alone."""
        if self.work is None:
            return self
        scale = work / self.work
        return StageTimes(self.forward_s * scale, self.backward_input_s * scale, self.backward_weight_s * scale, work)

    @property
    def backward_s(self) -> float:
        """The whole backward (a schedule that does not split it)."""
        return self.backward_input_s + self.backward_weight_s


def stage_times(device: SimAccelerator, work: float, stage_cost_s: Sequence[float]) -> list[StageTimes]:
    """Each model stage's times on ``device`` for a micro-batch of ``work`` units, from its share of the slowest's.

    ``work``: images, or a token micro-batch's cost in tokens; ``stage_cost_s``: each stage's measured cost. Give the
    times a ``work`` (``dataclasses.replace``) to have each micro-batch scale them to its own.

    Raises:
        ValueError: a work not above 0, or no stage cost, or a negative one.
    """
    if not work > 0:
        raise ValueError(f"micro_batch work must be > 0 (images, or a token micro-batch's cost in tokens), got {work}")
    if not stage_cost_s or any(c < 0 for c in stage_cost_s):
        raise ValueError(f"stage costs must be non-negative and at least one, got {list(stage_cost_s)}")
    slowest = max(stage_cost_s)
    shares = [c / slowest if slowest > 0 else 1.0 for c in stage_cost_s]
    per_micro = device.seconds(work)
    return [StageTimes(*(per_micro * share / 3,) * 3) for share in shares]
