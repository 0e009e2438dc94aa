"""The partitioner: cut a sequence of layers into contiguous pipeline stages of balanced cost.

Each layer's cost is measured (forward and backward time on a sample micro-batch, each pass timed apart, and
parameter + activation memory), and the stages are chosen to minimise the most expensive stage's forward +
backward, which is what bounds a pipeline's step time.
``torch.distributed.pipelining`` has no automatic balancing (DESIGN.md, "Known pitfalls"); this is it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["LayerCost", "Partition", "balance_costs", "measure_layers", "plan", "split"]


@dataclass(frozen=True)
class LayerCost:
    """One layer's cost per micro-batch: forward + backward seconds, parameter and activation bytes.

    ``time_s`` is what the partitioner balances by. :func:`measure_layers` also gives the passes it is made of
    (``forward_s``, and ``weight_s``: the weight-gradient part of the backward ``time_s - forward_s``); a cost
    given by hand may leave them out (``None``), since the partitioner needs only the sum.
    """

    time_s: float
    param_bytes: int
    activation_bytes: int
    forward_s: float | None = None
    weight_s: float | None = None

    @property
    def memory_bytes(self) -> int:
        """Parameters plus the activation it keeps for backward (approximated by its output)."""
        return self.param_bytes + self.activation_bytes


@dataclass(frozen=True)
class Partition:
    """A split of ``sum(balance)`` layers into ``len(balance)`` stages, with each stage's predicted cost."""

    balance: tuple[int, ...]
    stage_time_s: tuple[float, ...]
    stage_memory_bytes: tuple[int, ...]
    how: str

    def describe(self) -> str:
        """One line per stage: its layers, predicted time and memory."""
        lines = [f"split ({self.how}): balance {','.join(map(str, self.balance))}"]
        start = 0
        for i, (n, t, m) in enumerate(zip(self.balance, self.stage_time_s, self.stage_memory_bytes, strict=True)):
            lines.append(f"  stage {i}: layers {start}..{start + n - 1}  predicted fwd+bwd {t * 1e3:8.2f} ms"
                         f"/micro-batch  memory {m / 2**20:8.2f} MiB")
            start += n
        return "\n".join(lines)


def balance_costs(costs: Sequence[float], stages: int) -> list[int]:
    """Contiguous split of ``costs`` into ``stages`` non-empty runs minimising the largest run's sum.

    Dynamic programming over (layers, stages), O(L^2 S); ties go to the split whose earlier stages are lighter.

    Raises:
        ValueError: fewer layers than stages, or a negative cost.
    """
    n = len(costs)
    if stages < 1 or n < stages:
        raise ValueError(f"cannot split {n} layers into {stages} stages; each stage needs at least one layer")
    if any(c < 0 for c in costs):
        raise ValueError(f"layer costs must be >= 0, got {list(costs)}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[s][i]: the least max-stage cost putting the first i layers in s stages; cut[s][i]: where stage s starts.
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i] - 1e-12:
                    best[s][i], cut[s][i] = value, j
    sizes, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def _since(start: float, out: torch.Tensor) -> float:
    """Seconds since ``start``, once the device that made ``out`` is done."""
    if out.is_cuda:
        torch.cuda.synchronize(out.device)
    return time.perf_counter() - start


def _gradient_s(out: torch.Tensor, wrt: Sequence[torch.Tensor], grad: torch.Tensor, keep: bool) -> float:
    """Seconds to compute ``out``'s gradient for ``wrt`` alone (``keep``: the graph stays for another part)."""
    start = time.perf_counter()
    torch.autograd.grad(out, wrt, grad, retain_graph=keep, allow_unused=True)
    return _since(start, out)


def measure_layers(layers: Sequence[nn.Module], sample: torch.Tensor, repeats: int = 3) -> list[LayerCost]:
    """Time each layer's forward and backward on ``sample`` (one micro-batch) apart, and size its memory.

    Each layer is timed on its own input (the previous layer's output, detached), best of ``repeats`` after a
    warm-up, so the figures are per micro-batch and independent of the others. Per repeat, the forward is timed,
    then the whole backward (``backward()``) after it; on a second forward, the input gradient alone
    (``torch.autograd.grad`` for the input, keeping the graph) and then the weight gradient alone (for the
    parameters), as the zero-bubble schedules run them. A convolution's forward can cost as much as its
    backward, a linear layer's about half, so no fixed share fits every layer. The weight-gradient share of the
    two parts splits the whole backward (``weight_s``): the parts timed apart cost a little more than the whole,
    each being one more pass of the autograd engine. The layers themselves are not touched (copies are run).
    """
    costs, x = [], sample
    # On copies: a forward in training mode moves BatchNorm's running statistics, and these samples are noise.
    for layer in copy.deepcopy(list(layers)):
        params = [p for p in layer.parameters() if p.requires_grad]
        forward = backward = inputs = weights = float("inf")
        out = x
        for _ in range(repeats + 1):
            inp = x.detach().requires_grad_(x.is_floating_point())
            start = time.perf_counter()
            out = layer(inp)
            forward = min(forward, _since(start, out))
            if not out.requires_grad:  # nothing to differentiate (an integer input and no parameters)
                backward = inputs = weights = 0.0
                continue
            grad = torch.ones_like(out)
            start = time.perf_counter()
            out.backward(grad)
            backward = min(backward, _since(start, out))
            again = layer(inp)  # the two parts, on a graph of their own
            inputs = min(inputs, _gradient_s(again, [inp], grad, keep=bool(params)) if inp.requires_grad else 0.0)
            weights = min(weights, _gradient_s(again, params, grad, keep=False) if params else 0.0)
        layer.zero_grad(set_to_none=True)
        share = weights / (inputs + weights) if inputs + weights > 0 else 0.0
        costs.append(LayerCost(forward + backward, sum(p.numel() * p.element_size() for p in layer.parameters()),
                               out.numel() * out.element_size(), forward, backward * share))
        x = out.detach()
    return costs


def split(layers: Sequence[nn.Module], balance: Sequence[int]) -> list[nn.Sequential]:
    """The stages: ``balance[i]`` consecutive layers each, as ``nn.Sequential`` (sharing the layers' modules).

    Raises:
        ValueError: ``balance`` does not sum to the number of layers, or has a non-positive entry.
    """
    if any(b <= 0 for b in balance):
        raise ValueError(f"every stage needs at least one layer, got balance {list(balance)}")
    if sum(balance) != len(layers):
        raise ValueError(f"model and sum of balance have different length (model: {len(layers)} layers, "
                         f"sum of balance: {sum(balance)}); give one count per stage that sum to {len(layers)}")
    stages, start = [], 0
    for b in balance:
        stages.append(nn.Sequential(*layers[start:start + b]))
        start += b
    return stages


def plan(layers: Sequence[nn.Module], stages: int, sample: torch.Tensor | None = None,
         balance: Sequence[int] | None = None, memory_weight: float = 0.5,
         costs: Sequence[LayerCost] | None = None) -> Partition:
    """Choose (or check) a split of ``layers`` into ``stages`` and predict each stage's cost.

    Args:
        layers: the model's layers in order.
        stages: how many pipeline stages.
        sample: one micro-batch of input, for measuring; not needed with ``costs``.
        balance: an explicit split (``--balance 3,5,4``); only predicted, not chosen.
        memory_weight: how much a layer's share of memory counts beside its share of time when balancing
            (cost = time share + ``memory_weight`` x memory share), so a stage is neither slow nor oversized.
        costs: already measured costs (tests give known ones).

    Raises:
        ValueError: a balance of the wrong length or sum, or neither ``sample`` nor ``costs``.
    """
    if costs is None:
        if sample is None:
            raise ValueError("plan() needs a sample micro-batch to measure layers, or measured costs")
        costs = measure_layers(layers, sample)
    if len(costs) != len(layers):
        raise ValueError(f"got {len(costs)} costs for {len(layers)} layers")
    if balance is not None:
        if len(balance) != stages:
            raise ValueError(f"--balance has {len(balance)} entries ({','.join(map(str, balance))}) but the "
                             f"pipeline has {stages} stages")
        split(layers, balance)
        chosen, how = list(balance), "explicit"
    else:
        total_t = sum(c.time_s for c in costs) or 1.0
        total_m = sum(c.memory_bytes for c in costs) or 1
        mixed = [c.time_s / total_t + memory_weight * c.memory_bytes / total_m for c in costs]
        chosen, how = balance_costs(mixed, stages), "measured time + memory"
    times, mems, start = [], [], 0
    for b in chosen:
        times.append(sum(c.time_s for c in costs[start:start + b]))
        mems.append(sum(c.memory_bytes for c in costs[start:start + b]))
        start += b
    return Partition(tuple(chosen), tuple(times), tuple(mems), how)
