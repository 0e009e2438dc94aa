"""A pipeline stage that times its own compute, and the forward-only chain used for evaluation.

:class:`TimedStage` is a ``torch.distributed.pipelining.PipelineStage`` whose forward, backward and
weight-gradient chunks are timed: their sum is the rank's busy time, and the rest of the schedule's step is its
bubble (waiting for neighbours). Communication is issued by the schedule outside these calls, so it counts as
idle, which is what the bubble is. Under a simulated accelerator (:mod:`stallfree.stage_runtime.stage_times`)
each chunk lasts the device's time: it waits for what its (stand-in) compute left of it. That time is the stage's
per micro-batch, scaled by the work of the chunk's own micro-batch, which the stand-in reads from its input at the
forward (images, or a token micro-batch's documents' cost) and the chunk's backward and weight gradient reuse.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

from stallfree.core.accelerator import hold
from stallfree.stage_runtime.stage_times import StageTimes

__all__ = ["SimulatedCompute", "TimedStage", "chain_forward"]


class TimedStage(PipelineStage):
    """``PipelineStage`` adding ``busy_s`` (seconds computing since the last :meth:`take_busy`) and clock spans.

    ``delay_s`` (next, previous): the latency of the link to the next and to the previous stage's rank
    (``--link-delay``; how it is run: :mod:`stallfree.stage_runtime.link_delay`). A message over a delayed link
    carries its sender's clock reading, and the receiver starts the chunk that reads it no sooner than that reading
    plus the delay; each such wait is a ``waiting`` span of ``link{index}``.

    ``sim``: the simulated device's times of this stage for a micro-batch of ``sim.work``; each chunk's are scaled to
    its micro-batch's work, as the module (a :class:`SimulatedCompute`) read it at the chunk's forward (``sim.work``
    None: every chunk takes ``sim``'s times).
    """

    def __init__(self, *args: Any, clock: Any = None, sim: StageTimes | None = None,
                 delay_s: tuple[float, float] = (0.0, 0.0), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.busy_s, self.clock, self.step_number, self.sim, self.delay_s = 0.0, clock, 0, sim, delay_s
        # ("F" or "B", chunk) -> (the sender's clock reading, filled by its receive; the link's delay)
        self._sent_at: dict[tuple[str, int], tuple[torch.Tensor, float]] = {}
        self._works: dict[int, float] = {}  # chunk -> its micro-batch's work, read at its forward

    def _device_s(self, kind: str, chunk: int) -> Callable[[], float] | None:
        """The device's seconds of a chunk (``F``, ``B``, ``I`` or ``W``), asked once its compute ran; None: real."""
        sim = self.sim
        if sim is None:
            return None

        def seconds() -> float:
            if kind == "F" and isinstance(self.submod, SimulatedCompute):
                self._works[chunk] = self.submod.work
            times = sim.for_work(self._works[chunk]) if chunk in self._works else sim
            return {"F": times.forward_s, "B": times.backward_s, "I": times.backward_input_s,
                    "W": times.backward_weight_s}[kind]
        return seconds

    def _timed(self, sim_s: Callable[[], float] | None, fn: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            if sim_s is not None:
                hold(sim_s(), since=start)  # the device's time for this chunk: holds no core, no GIL
            end = time.perf_counter()
            self.busy_s += end - start
            if self.clock is not None:
                self.clock.record(f"stage{self.stage_index}", "busy", start, end, self.step_number)

    def forward_one_chunk(self, fwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        self._delivered(("F", fwd_chunk_id))
        return self._timed(self._device_s("F", fwd_chunk_id), super().forward_one_chunk, fwd_chunk_id, *args,
                           **kwargs)

    def backward_one_chunk(self, bwd_chunk_id: int, loss: Any = None, full_backward: bool = True,
                           last_backward: bool = False) -> Any:
        self._delivered(("B", bwd_chunk_id))
        return self._timed(self._device_s("B" if full_backward else "I", bwd_chunk_id), super().backward_one_chunk,
                           bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward)

    def backward_weight_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        chunk = args[0] if args else kwargs["bwd_chunk_id"]
        return self._timed(self._device_s("W", chunk), super().backward_weight_one_chunk, *args, **kwargs)

    # torch's schedules take a chunk's send ops right after its compute and its receive ops before it, post each
    # list as one batch and wait for the whole batch before the chunk that reads it: a clock reading appended to
    # both lists travels with the message, in the same order on the pair (gloo and NCCL match in posting order).
    # No ops: the neighbouring stage is on this rank, and nothing crosses a link.

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._stamped(self.delay_s[0], super().get_fwd_send_ops(fwd_chunk_id))

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._stamped(self.delay_s[1], super().get_bwd_send_ops(bwd_chunk_id))

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list[dist.P2POp]:
        return self._stamp_received(self.delay_s[1], ("F", fwd_chunk_id), super().get_fwd_recv_ops(fwd_chunk_id))

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list[dist.P2POp]:
        return self._stamp_received(self.delay_s[0], ("B", bwd_chunk_id), super().get_bwd_recv_ops(bwd_chunk_id))

    def _stamped(self, delay: float, ops: list[dist.P2POp]) -> list[dist.P2POp]:
        if not ops or delay <= 0:
            return ops
        stamp = torch.tensor([time.perf_counter()], dtype=torch.float64, device=_comm_device(self.device))
        return [*ops, dist.P2POp(dist.isend, stamp, _one_peer(ops), ops[0].group)]

    def _stamp_received(self, delay: float, key: tuple[str, int], ops: list[dist.P2POp]) -> list[dist.P2POp]:
        if not ops or delay <= 0:
            return ops
        stamp = torch.empty(1, dtype=torch.float64, device=_comm_device(self.device))
        self._sent_at[key] = (stamp, delay)
        return [*ops, dist.P2POp(dist.irecv, stamp, _one_peer(ops), ops[0].group)]

    def _delivered(self, key: tuple[str, int]) -> None:
        """Wait until the chunk's delayed input has arrived: its sender's reading plus the link's delay."""
        received = self._sent_at.pop(key, None)
        if received is None:
            return
        stamp, delay = received
        start = time.perf_counter()
        hold(delay, since=float(stamp.item()))  # one clock for every process of the machine (CLOCK_MONOTONIC)
        if self.clock is not None:
            self.clock.record(f"link{self.stage_index}", "waiting", start, time.perf_counter(), self.step_number)

    def take_busy(self) -> float:
        """Busy seconds since the last call, and reset."""
        busy, self.busy_s = self.busy_s, 0.0
        return busy


def _one_peer(ops: list[dist.P2POp]) -> int:
    """The one rank a chunk's messages go to or come from (a sequential pipeline's stage has one neighbour a side)."""
    peers = {op.peer for op in ops}
    if len(peers) != 1:
        raise NotImplementedError(f"--link-delay delays a stage's messages to one neighbour; this chunk's go to or "
                                  f"come from ranks {sorted(peers)}")
    return peers.pop()


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


def _rows(x: torch.Tensor) -> float:
    return float(x.shape[0])


class SimulatedCompute(nn.Module):
    """A stage module that computes nothing: the real layers' parameters, and an output of the real shape.

    The output is zeros plus one element of the input times zero: it costs one write of the activation (what a
    device hands to the send), and autograd reaches the input, so the gradient sent upstream has the real shape.
    ``carry`` (given the input) is what the next stage still reads, put in the output's last channel (a token model's
    documents, which its next stage's micro-batch work is read from); ``work`` (given the input) is the micro-batch's
    work on the simulated device, kept in :attr:`work` for the stage's chunks (default: its rows, images).
    The parameters are outside the graph (touching each would cost the host a few operations per parameter and
    micro-batch, for a resnet50 more than its simulated compute); :meth:`zero_grads` gives each a zero gradient
    before the data-parallel all-reduce and the optimizer step, which then run on the real tensors.
    """

    def __init__(self, real: nn.Module, output_shape: Sequence[int],
                 work: Callable[[torch.Tensor], float] = _rows,
                 carry: Callable[[torch.Tensor], torch.Tensor | None] | None = None):
        super().__init__()
        for name, child in real.named_children():  # the real layers, never called: state_dict keys stay the same
            self.add_module(name, child)
        self.output_shape = tuple(output_shape)  # per sample
        self._zeros: list[torch.Tensor] | None = None
        self.work_of, self.carry = work, carry
        self.work = 0.0  # the last micro-batch's work (images, or tokens of cost)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.work = self.work_of(x)
        touch = x.reshape(-1)[:1].sum() * 0
        out = torch.zeros((x.shape[0], *self.output_shape), dtype=torch.float32, device=x.device) + touch
        carried = None if self.carry is None else self.carry(x)
        if carried is not None:
            out = torch.cat([out[..., :-1], carried.unsqueeze(-1).to(out.dtype)], dim=-1)
        return out

    def zero_grads(self) -> None:
        """Give every parameter a zero gradient (allocated once, cleared each step), as a step's backward would."""
        params = list(self.parameters())
        if self._zeros is None:
            self._zeros = [torch.zeros_like(p) for p in params]
        for p, zero in zip(params, self._zeros, strict=True):
            p.grad = zero.zero_()
