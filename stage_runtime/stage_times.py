"""The simulated accelerator's time per model stage: how a pipeline splits a device of ``R`` images/s.

``R`` (:class:`~stallfree.core.accelerator.SimAccelerator`) is the replica's compute rate: with no input wait and no
bubble, the pipeline would train ``R`` images per second. The slowest model stage therefore takes ``m / R`` seconds
per micro-batch of ``m`` images, and every other stage its measured share of that (the partitioner's forward +
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
    """Seconds one model stage computes per micro-batch on the simulated device."""

    forward_s: float
    backward_input_s: float
    backward_weight_s: float

    @property
    def backward_s(self) -> float:
        """The whole backward (a schedule that does not split it)."""
        return self.backward_input_s + self.backward_weight_s


def stage_times(device: SimAccelerator, micro_batch: int, stage_cost_s: Sequence[float]) -> list[StageTimes]:
    """Each model stage's times on ``device`` for a micro-batch, from its measured cost relative to the slowest's.

    Raises:
        ValueError: a micro-batch under 1 image, or no stage cost, or a negative one.
    """
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    if not stage_cost_s or any(c < 0 for c in stage_cost_s):
        raise ValueError(f"stage costs must be non-negative and at least one, got {list(stage_cost_s)}")
    slowest = max(stage_cost_s)
    shares = [c / slowest if slowest > 0 else 1.0 for c in stage_cost_s]
    per_micro = device.seconds(micro_batch)
    return [StageTimes(*(per_micro * share / 3,) * 3) for share in shares]
