"""A model's layers measured as the simulator reads them, by the partitioner's measurement.

The one ``stallfree train`` splits with: each layer's forward, backward and weight-gradient seconds, and one
optimizer step over the whole model.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.models.partition import LayerCost, measure_layers

__all__ = ["layer_times", "measure_model"]


def layer_times(cost: LayerCost) -> LayerTimes:
    """A :class:`~stallfree.stage_runtime.models.partition.LayerCost` from ``measure_layers`` as the simulator's.

    Raises:
        ValueError: a cost without its passes (one given by hand: only ``measure_layers`` times them apart).
    """
    if cost.forward_s is None or cost.weight_s is None:
        raise ValueError(f"layer cost {cost} has no forward and weight-gradient seconds of its own; measure it "
                         "with measure_layers, which times each pass apart")
    return LayerTimes(cost.forward_s, cost.time_s - cost.forward_s, cost.weight_s, cost.param_bytes,
                      cost.activation_bytes)


def measure_model(model: nn.Sequential, image_size: int, micro: int, device: str = "cpu",
                  repeats: int = 3, sample: torch.Tensor | None = None) -> tuple[list[LayerTimes], float]:
    """Time every layer of ``model`` (an ``nn.Sequential``) on one micro-batch of ``micro`` images.

    ``sample``: the micro-batch stage 0 takes when it is not images (a token model's, ``Task.example``).
    Returns the layers' costs (the forward, the backward and its weight-gradient part, each timed by
    :func:`~stallfree.stage_runtime.models.partition.measure_layers`) and the seconds of one SGD-with-momentum step
    over the whole model, the trainer's optimizer.
    """
    model = model.to(device)
    if sample is None:
        sample = torch.randn(micro, 3, image_size, image_size, device=device)
    sample = sample.to(device)
    measured = measure_layers(list(model), sample, repeats=repeats)
    layers = [layer_times(c) for c in measured]
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return layers, 0.0
    optimizer = torch.optim.SGD(params, lr=1e-9, momentum=0.9)  # a tiny rate: the copies stay near their values
    for p in params:
        p.grad = torch.zeros_like(p)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        optimizer.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    for p in params:
        p.grad = None
    return layers, best
