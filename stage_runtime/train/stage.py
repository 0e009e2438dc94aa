"""A pipeline stage that times its own compute, and the forward-only chain used for evaluation.

:class:`TimedStage` is a ``torch.distributed.pipelining.PipelineStage`` whose forward, backward and
weight-gradient chunks are timed: their sum is the rank's busy time, and the rest of the schedule's step is its
bubble (waiting for neighbours). Communication is issued by the schedule outside these calls, so it counts as
idle, which is what the bubble is.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

__all__ = ["TimedStage", "chain_forward"]


class TimedStage(PipelineStage):
    """``PipelineStage`` adding ``busy_s`` (seconds computing since the last :meth:`take_busy`) and clock spans."""

    def __init__(self, *args: Any, clock: Any = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.busy_s, self.clock, self.step_number = 0.0, clock, 0

    def _timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            end = time.perf_counter()
            self.busy_s += end - start
            if self.clock is not None:
                self.clock.record(f"stage{self.stage_index}", "busy", start, end, self.step_number)

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().backward_one_chunk, *args, **kwargs)

    def backward_weight_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().backward_weight_one_chunk, *args, **kwargs)

    def take_busy(self) -> float:
        """Busy seconds since the last call, and reset."""
        busy, self.busy_s = self.busy_s, 0.0
        return busy


def _comm_device(device: torch.device) -> torch.device:
    """Where tensors must be to be sent: CUDA for NCCL, the CPU for gloo."""
    return device if dist.get_backend() == "nccl" else torch.device("cpu")


def _send_tensor(x: torch.Tensor, dst: int) -> None:
    comm = _comm_device(x.device)
    header = torch.tensor([x.dim(), *x.shape] + [0] * (8 - x.dim()), dtype=torch.int64, device=comm)
    dist.send(header, dst)
    dist.send(x.contiguous().to(comm), dst)


def _recv_tensor(src: int, device: torch.device) -> torch.Tensor:
    comm = _comm_device(device)
    header = torch.empty(9, dtype=torch.int64, device=comm)
    dist.recv(header, src)
    shape = header[1:1 + int(header[0])].tolist()
    x = torch.empty(shape, dtype=torch.float32, device=comm)
    dist.recv(x, src)
    return x.to(device)


@torch.no_grad()
def chain_forward(modules: dict[int, nn.Module], num_stages: int, owner: list[int], me: int,
                  x: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """Run one batch forward through every stage in order, sending activations between owning ranks.

    ``modules`` maps the global stage indices this rank holds to their modules, ``owner[s]`` is the global rank
    of stage ``s`` and ``x`` the input on stage 0's owner. Returns the logits on the last stage's owner, else
    ``None``. Shapes travel with the data, so the last, shorter evaluation batch needs no padding.
    """
    for s in range(num_stages):
        if owner[s] != me:
            continue
        if s > 0 and owner[s - 1] != me:
            x = _recv_tensor(owner[s - 1], device)
        assert x is not None
        x = modules[s](x).float()
        if s < num_stages - 1 and owner[s + 1] != me:
            _send_tensor(x, owner[s + 1])
    return x if owner[num_stages - 1] == me else None
