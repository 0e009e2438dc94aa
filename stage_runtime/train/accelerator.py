"""The simulated accelerator: ``--accelerator sim:R`` makes each stage's compute take the time a device would.

On a training machine the model runs on accelerators and the host's cores only feed them. On a machine without
one, ``sim:R`` shows that case honestly: every pipeline stage's forward and backward *waits* (``time.sleep``, which
holds neither a core nor the GIL) for as long as a device running one replica at ``R`` images per second would
compute, while everything else runs for real: the Loader, the sends of real-sized activation tensors between
stages, the labels and the loss, the optimizer step on the real parameters, checkpoints.

How the wait is derived. ``R`` is the replica's compute rate: with no input wait and no bubble, the pipeline
would train ``R`` images per second. The slowest model stage therefore takes ``m / R`` seconds per micro-batch of
``m`` images, and every other stage its measured share of that (the partitioner's forward + backward time of its
layers, over the slowest stage's). Each stage's time splits one third forward, one third backward to the input,
one third backward to the weights (the usual 1 : 1 : 1 of the zero-bubble paper); a schedule that runs the
backward whole waits for both thirds at once.

What runs in place of the layers. Each stage's module is a ``stage.SimulatedCompute`` over the real one: it keeps
the real parameters, which get zero gradients each step (so the data-parallel all-reduce, the optimizer step and
checkpoints handle real tensors), and returns an activation of the real shape connected to its input, so the
gradients sent back between stages have the real shape too. Throughput under ``sim`` therefore measures
the input path and the pipeline, not the model; losses and accuracies under ``sim`` mean nothing.

This module is the device model alone and imports no torch, so ``TrainConfig`` can check ``--accelerator``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SimAccelerator", "StageTimes", "parse_accelerator"]


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


@dataclass(frozen=True)
class SimAccelerator:
    """A device that runs one replica's forward + backward at ``images_per_s``."""

    images_per_s: float

    def __post_init__(self) -> None:
        if not self.images_per_s > 0:
            raise ValueError(f"accelerator speed must be > 0 images/s, got {self.images_per_s}")

    def __str__(self) -> str:
        return f"sim:{self.images_per_s:g}"

    def stage_times(self, micro_batch: int, stage_cost_s: Sequence[float]) -> list[StageTimes]:
        """Each model stage's times for a micro-batch, from its measured cost relative to the slowest stage's."""
        if micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
        if not stage_cost_s or any(c < 0 for c in stage_cost_s):
            raise ValueError(f"stage costs must be non-negative and at least one, got {list(stage_cost_s)}")
        slowest = max(stage_cost_s)
        shares = [c / slowest if slowest > 0 else 1.0 for c in stage_cost_s]
        per_micro = micro_batch / self.images_per_s
        return [StageTimes(*(per_micro * share / 3,) * 3) for share in shares]


def parse_accelerator(text: str | None) -> SimAccelerator | None:
    """``"sim:R"`` (R images/s per replica) as a :class:`SimAccelerator`; ``None`` or ``"none"``: the real device.

    Raises:
        ValueError: anything else, naming the accepted forms.
    """
    if text is None or text == "none":
        return None
    kind, _, speed = text.partition(":")
    try:
        rate = float(speed) if kind == "sim" else None
    except ValueError:
        rate = None
    if rate is None:
        raise ValueError(f"--accelerator must be sim:IMAGES_PER_S (e.g. sim:1000) or none, got {text!r}")
    return SimAccelerator(rate)
