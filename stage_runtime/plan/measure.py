"""Per-layer costs for the simulator, from the partitioner's measurement (the one ``stallfree train`` uses)."""

from __future__ import annotations

import time
from typing import Any

from .costs import BACKWARD_SHARE, LayerTimes

__all__ = ["measure_model"]


def measure_model(model: Any, image_size: int, micro: int, device: str = "cpu",
                  repeats: int = 3) -> tuple[list[LayerTimes], float]:
    """Time every layer of ``model`` (an ``nn.Sequential``) on one micro-batch of ``micro`` images.

    Returns the layers' costs (forward + backward measured together by
    :func:`~stallfree.stage_runtime.train.partition.measure_layers`, split by :data:`~.costs.BACKWARD_SHARE`) and the
    seconds of one SGD-with-momentum step over the whole model, the trainer's optimizer.
    """
    import torch

    from stallfree.stage_runtime.train.partition import measure_layers

    model = model.to(device)
    sample = torch.randn(micro, 3, image_size, image_size, device=device)
    measured = measure_layers(list(model), sample, repeats=repeats)
    layers = []
    for c in measured:
        backward = c.time_s * BACKWARD_SHARE
        layers.append(LayerTimes(c.time_s - backward, backward, backward / 2, c.param_bytes, c.activation_bytes))
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
