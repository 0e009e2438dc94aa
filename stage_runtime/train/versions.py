"""A stage's weight versions under PipeDream-2BW: the one forwards read, and the older one micro-batches in flight hold.

A forward runs on the module's current parameters, and autograd keeps those tensors for the backward, so a
micro-batch's gradient is computed at the weights its forward read. An update must therefore not write them in
place while a micro-batch that read them is in flight: it first moves the module (and the optimizer's state) onto
fresh copies, then steps those. The old tensors live on only in the in-flight graphs and are freed with their last
backward; with ``M >= S-1`` at most two versions are alive at once (the check is ``ScheduleSpec.check``)::

    rank 0 of S=2, M=4 (w=1 micro-batch in flight at a step's end; u: the update after the step's 4th backward)
    F0 F1 B0 F2 B1 F3 B2 | F4 B3 u F5 B4 ...      F4 read version 0, its backward lands in update 1: 1 stale

Gradients of every version go into the current parameters' ``.grad`` (the one accumulator the optimizer steps):
PipeDream-2BW's ``W(t+1) = W(t) - lr * grad f(W(t-1))``, each micro-batch's gradient taken at the version it read.
"""

from __future__ import annotations

from typing import Any

from torch import nn

__all__: list[str] = []


class WeightVersions:
    """The versions of one stage's parameters, counted: most alive at once and staleness (updates) per backward."""

    def __init__(self, module: nn.Module, optimizer: Any | None):
        self.module, self.optimizer = module, optimizer
        self.version = 0  # updates applied so far: the version forwards read now
        self._read: dict[int, tuple[int, list[nn.Parameter]]] = {}  # micro-batch -> (version read, its tensors)
        self.most_alive, self.most_stale = 1, 0

    def read(self, microbatch: int) -> None:
        """A forward of ``microbatch`` is about to run on the current parameters."""
        self._read[microbatch] = (self.version, list(self.module.parameters()))

    def done(self, microbatch: int) -> None:
        """Its backward ran: move the gradient it left on the version it read into the current accumulator."""
        version, params = self._read.pop(microbatch)
        # The update this gradient goes into is the next one, number `self.version` (0-based).
        self.most_stale = max(self.most_stale, self.version - version)
        if version == self.version:
            return  # it read the current tensors: the gradient is already where the optimizer looks
        for old, current in zip(params, self.module.parameters(), strict=True):
            if old.grad is not None:
                current.grad = old.grad if current.grad is None else current.grad.add_(old.grad)
                old.grad = None

    def update(self, step: Any) -> None:
        """Apply one update by calling ``step()`` (optimizer step and zeroing), keeping the read version if needed."""
        if any(v == self.version for v, _ in self._read.values()):
            self._detach_current()
        step()
        self.version += 1
        alive = {v for v, _ in self._read.values()} | {self.version}
        self.most_alive = max(self.most_alive, len(alive))

    def in_flight(self) -> int:
        """Micro-batches whose forward ran and backward did not."""
        return len(self._read)

    def _detach_current(self) -> None:
        """Put fresh copies of the current parameters in the module and the optimizer; the old ones stay read-only."""
        fresh: dict[int, nn.Parameter] = {}
        for sub in self.module.modules():
            for name, p in list(sub._parameters.items()):
                if p is None:
                    continue
                if id(p) not in fresh:  # a parameter shared by two layers gets one copy
                    new = nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                    new.grad, p.grad = p.grad, None  # the accumulated gradient moves with the version being updated
                    fresh[id(p)] = new
                    if self.optimizer is not None and p in self.optimizer.state:
                        self.optimizer.state[new] = self.optimizer.state.pop(p)
                sub._parameters[name] = fresh[id(p)]
        for group in self.optimizer.param_groups if self.optimizer is not None else []:
            group["params"] = [fresh.get(id(p), p) for p in group["params"]]

