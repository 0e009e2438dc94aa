"""PipeDream-2BW: 1F1B over the micro-batches of consecutive steps, without a flush (``--schedule 2bw``).

torch's schedules end every ``step()`` with each micro-batch's backward done. This runner keeps micro-batches in
flight across ``step()`` calls instead, so the pipeline fills once (at the first step, and again after each
:meth:`TwoBW.drain`) and then runs one forward, one backward, with no idle slot::

    S=2, M=3; | ends a step() call; u: the update after a step's M-th backward on that stage
    rank0: F0 F1 B0 F2 | B1 F3 B2 u F4 B3 F5 | B4 F6 B5 u ...
    rank1: F0 B0 F1 B1 | F2 B2 u F3 B3 F4 B4 | F5 B5 u ...

Each rank's order is torch's 1F1B order over an endless stream of micro-batches, cut at each step's end: rank
``r`` stops ``r`` forwards short of the micro-batches given so far, and the first stage also leaves the backward
that follows its last forward for the next call. Every cut is a consistent prefix (no rank waits on a micro-batch
not given yet). Nothing synchronises the ranks between steps (the trainer gathers a step's figures one step
late, the labels go by ``isend``), so a rank runs on into the next step's part of the stream as soon as its inputs
are there: at any S the steady state has no idle slot but what the updates and uneven stages leave. Each stage
updates after every ``M`` of its backwards (the gradients accumulated, scaled by ``1/M`` as torch's schedules
do), and a micro-batch's backward uses the weights its forward read (:mod:`.versions`). Activations go forward
and gradients back by point-to-point sends on the pipeline's process group (``isend``, ``recv``), as torch's
stages send them.

Losses lag: the last stage's ``step()`` reports the losses of the ``M`` micro-batches it finished in that call,
the last ``S-1`` of the previous step and the first ``M-S+1`` of this one. Before an evaluation or a checkpoint the
caller drains the pipeline (:meth:`TwoBW.drain`): every forward and backward done, every update applied, one
weight version left, so a checkpoint is complete without any in-flight state (the drained micro-batches' losses
are not reported).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stallfree.core.accelerator import hold
from stallfree.stage_runtime.stage import SimulatedCompute
from stallfree.stage_runtime.stage_times import StageTimes
from stallfree.stage_runtime.train.versions import WeightVersions

__all__ = ["TwoBW"]

_ACTIVATION, _GRADIENT = 1, 2  # p2p tags (the labels' send uses the default, 0)


def _nothing(*args: Any) -> None:
    return None


class TwoBW:
    """One rank's stage of a 2BW pipeline: its order, sends, weight versions and updates.

    ``prev``/``next`` are the global ranks of the neighbouring stages (``None`` at the ends), ``input_shape`` and
    ``output_shape`` a micro-batch's, ``update`` what one optimizer update does once the gradients are in place
    (all-reduce over replicas, optimizer and scheduler step, zeroing). ``sim`` gives each chunk the simulated
    device's time (``SimulatedCompute`` stand-in), as ``stage.TimedStage`` does for torch's schedules.
    """

    def __init__(self, module: nn.Module, stage_index: int, *, prev: int | None, next: int | None,
                 microbatches: int, ranks: int, input_shape: tuple[int, ...], output_shape: tuple[int, ...],
                 device: torch.device, comm: torch.device, group: Any, optimizer: Any | None,
                 update: Callable[[], None], loss_fn: Callable[..., torch.Tensor], clock: Any = None,
                 sim: StageTimes | None = None):
        self.module, self.stage_index, self.prev, self.next = module, stage_index, prev, next
        self.microbatches, self.warmup = microbatches, ranks - 1 - stage_index  # micro-batches left in flight
        self.input_shape, self.output_shape = input_shape, output_shape
        self.device, self.comm, self.group, self.loss_fn = device, comm, group, loss_fn
        self.versions = WeightVersions(module, optimizer)
        self._update, self.clock, self.sim = update, clock, sim
        self.forwards = self.backwards = 0  # micro-batches forwarded / backwarded so far (global indices)
        self.given = 0  # micro-batches given so far (steps x M)
        self._inputs: deque[torch.Tensor] = deque()  # the first stage's micro-batches not forwarded yet
        self._targets: deque[torch.Tensor | Callable[[], torch.Tensor]] = deque()  # the last stage's, per step
        self._split: deque[torch.Tensor] = deque()  # the micro-batches' labels of the step being forwarded
        self._held: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}  # mb -> (input, output or loss)
        self._sends: list[Any] = []
        self.busy_s, self.step_number = 0.0, 0
        self._works: dict[int, float] = {}  # mb -> its work on the simulated device, read by the stand-in's forward

    def step(self, images: torch.Tensor | None = None,
             target: torch.Tensor | Callable[[], torch.Tensor] | None = None,
             losses: list[torch.Tensor] | None = None) -> None:
        """Take one step's ``M`` micro-batches and run this rank's part of the 1F1B order up to its cut.

        ``images`` is the step's batch on the first stage, ``target`` its labels on the last (or a function that
        waits for them: called at the first forward of this step's micro-batches, which at S>=2 comes after the
        previous step's micro-batches left in flight), where ``losses`` gets the losses of the micro-batches
        finished in this call.
        """
        if images is not None:
            self._inputs.extend(images.tensor_split(self.microbatches))
        if target is not None:
            self._targets.append(target)
        self.given += self.microbatches
        # the first stage (of several) cuts before the backward after its last forward, the others r forwards early
        self._run(self.given - self.stage_index, losses, defer=self.prev is None and self.next is not None)
        # The sends are not waited for here: the gradients of the micro-batches the previous stage still holds are
        # received in its next call, which may start only after this rank's (the trainer waits for no other rank).

    def drain(self) -> None:
        """Run every forward and backward left (and the updates that close their steps): one weight version left."""
        self._run(self.given, None, defer=False)
        while self.backwards < self.forwards:
            self._backward()
        self._wait_sends()

    def _run(self, until: int, losses: list[torch.Tensor] | None, defer: bool) -> None:
        """Forwards up to micro-batch ``until``, each followed by a backward once ``w`` are in flight (1F1B).

        ``defer``: leave the backward that follows the last forward for the next call (the first stage's cut).
        """
        if self.forwards - self.backwards > self.warmup:  # the backward left after the last call's last forward
            self._backward()
        while self.forwards < until:
            x = self._inputs.popleft() if self.prev is None else None
            y = self._target() if self.next is None else None
            self._forward(x, y, losses)
            if self.forwards - self.backwards > self.warmup and not (defer and self.forwards == until):
                self._backward()

    def _target(self) -> torch.Tensor | None:
        """The next micro-batch's labels (the last stage's), waiting for its step's labels at its first."""
        if not self._split and self._targets:
            target = self._targets.popleft()
            self._split.extend((target() if callable(target) else target).tensor_split(self.microbatches))
        return self._split.popleft() if self._split else None

    def take_busy(self) -> float:
        """Busy seconds since the last call, and reset."""
        busy, self.busy_s = self.busy_s, 0.0
        return busy

    def _forward(self, x: torch.Tensor | None, y: torch.Tensor | None, losses: list[torch.Tensor] | None) -> None:
        mb = self.forwards
        if self.prev is not None:
            x = self._recv(self.input_shape, self.prev, _ACTIVATION).requires_grad_(True)
        if x is None:
            raise ValueError(f"stage {self.stage_index}: the first stage's step() needs images")
        self.versions.read(mb)
        out = self._timed(self._device_s(mb, forward=True), self.module, x)
        if self.next is None:
            if y is None:
                raise ValueError(f"stage {self.stage_index}: the last stage's step() needs a target")
            out = self.loss_fn(out, y)
            if losses is not None:
                losses.append(out.detach())
        else:
            self._send(out.detach(), self.next, _ACTIVATION)
        self._held[mb] = (x if self.prev is not None else None, out)
        self.forwards += 1

    def _backward(self) -> None:
        mb = self.backwards
        x, out = self._held.pop(mb)
        if self.next is None:
            grad = None
            out = out / self.microbatches  # torch's schedules scale each micro-batch's gradient by 1/M
        else:
            grad = self._recv(self.output_shape, self.next, _GRADIENT)
        # Under sim:R the first stage's stand-in leaves nothing to differentiate: its time is the device's alone.
        backward = torch.autograd.backward if out.requires_grad else _nothing
        self._timed(self._device_s(mb, forward=False), backward, out, grad)
        if x is not None:
            assert x.grad is not None
            self._send(x.grad, self.prev, _GRADIENT)  # type: ignore[arg-type]
        self.versions.done(mb)
        self.backwards += 1
        if self.backwards % self.microbatches == 0:
            self.versions.update(self._update)

    def _device_s(self, mb: int, forward: bool) -> Callable[[], float] | None:
        """The device's seconds of micro-batch ``mb``'s forward or backward, asked once its compute ran.

        As ``TimedStage``'s: the stage's times scaled to the micro-batch's work, read by the stand-in at the forward.
        """
        sim = self.sim
        if sim is None:
            return None

        def seconds() -> float:
            if forward and isinstance(self.module, SimulatedCompute):
                self._works[mb] = self.module.work
            times = sim.for_work(self._works[mb]) if mb in self._works else sim
            if not forward:
                self._works.pop(mb, None)
            return times.forward_s if forward else times.backward_s
        return seconds

    def _timed(self, sim_s: Callable[[], float] | None, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            if sim_s is not None:
                hold(sim_s(), since=start)  # the simulated device's time for this chunk
            end = time.perf_counter()
            self.busy_s += end - start
            if self.clock is not None:
                self.clock.record(f"stage{self.stage_index}", "busy", start, end, self.step_number)

    def _send(self, x: torch.Tensor, dst: int, tag: int) -> None:
        self._sends = [work for work in self._sends if not work.is_completed()]
        self._sends.append(dist.isend(x.detach().contiguous().to(self.comm), dst, group=self.group, tag=tag))

    def _recv(self, shape: tuple[int, ...], src: int, tag: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=torch.float32, device=self.comm)
        dist.recv(buf, src, group=self.group, tag=tag)
        return buf.to(self.device)

    def _wait_sends(self) -> None:
        for work in self._sends:
            work.wait()
        self._sends.clear()
