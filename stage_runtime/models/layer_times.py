"""Per-layer costs as the simulator reads them: :class:`LayerTimes`. This module imports no torch.

The trainer's rank 0 measures them to split the model and writes them in its summary (:mod:`.measure`); the
planner measures a model the same way, or reads them from a file (:mod:`stallfree.stage_runtime.plan.costs`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LayerTimes"]


@dataclass(frozen=True)
class LayerTimes:
    """One layer's cost for one micro-batch: seconds per pass, parameter bytes, output activation bytes."""

    forward_s: float
    backward_s: float  # input + weight gradient
    weight_s: float  # the weight-gradient part of backward_s
    param_bytes: int
    activation_bytes: int
