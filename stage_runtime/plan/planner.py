"""Rank every (schedule, stages, virtual stages, micro-batches, split) by simulated step time within memory.

Pipeline rank r runs on device r; devices are split evenly into sites, so a plan of fewer ranks than devices
uses the first site first, and a cut between ranks on two sites goes over the cross-site link.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from stallfree.stage_runtime.models import partition
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.schedules import FLUSHING, SCHEDULE_SPECS, schedule_spec

from .books import Books, predicted_books
from .costs import FREE_LINK, NO_OVERHEAD, Cores, HostOverhead, Link, StageCost, stage_costs
from .orders import placement, torch_order
from .simulate import StepResult, simulate_step

__all__ = ["Candidate", "Network", "SYNC_SCHEDULES", "rank_plans", "splits"]

SYNC_SCHEDULES = FLUSHING  # the table's that flush (2bw does not: it is simulated in .asynchronous)
# Weights, their gradients and SGD's momentum buffer: the trainer's optimizer holds three copies of each parameter.
STATE_COPIES = 3


@dataclass(frozen=True)
class Network:
    """``devices`` in ``sites`` equal groups: ``link`` inside a site, ``cross_link`` between sites."""

    devices: int
    link: Link
    cross_link: Link
    sites: int = 1

    def __post_init__(self) -> None:
        if self.devices < 1 or self.sites < 1 or self.devices % self.sites:
            raise ValueError(f"--devices {self.devices} must split evenly into --sites {self.sites}")

    def site(self, device: int) -> int:
        """The site of ``device``."""
        return device // (self.devices // self.sites)

    def between(self, a: int, b: int) -> Link:
        """The link from device ``a`` to device ``b``."""
        if a == b:
            return FREE_LINK
        return self.link if self.site(a) == self.site(b) else self.cross_link


@dataclass(frozen=True)
class Candidate:
    """One configuration and its simulated step."""

    schedule: str
    ranks: int
    virtual: int  # model stages per rank
    microbatches: int
    balance: tuple[int, ...]
    split: str  # "time" or "time+memory" (the trainer's own rule)
    batch: int
    result: StepResult
    memory_bytes: tuple[int, ...]  # per rank: weights, gradients, momentum, peak activations
    fits: bool
    cross_cuts: int  # stage boundaries that cross sites
    costs: tuple[StageCost, ...] = field(repr=False)

    @property
    def images_per_s(self) -> float:
        """Images per second at the simulated step time."""
        return self.batch / self.result.step_s if self.result.step_s > 0 else float("inf")

    def books(self) -> Books:
        """The simulated step's books (:mod:`.books`): per rank, could-do and the loss by part."""
        order = torch_order(self.schedule, self.ranks, self.microbatches, self.virtual)
        return predicted_books(self.result, order, placement(self.schedule, self.ranks, len(self.costs)), self.costs,
                               self.batch)

    def to_dict(self) -> dict[str, Any]:
        """As ``plan.json`` writes it; the first keys are ``stallfree train``'s flags."""
        r = self.result
        return {"schedule": self.schedule, "stages": self.ranks, "virtual_stages": self.virtual,
                "microbatches": self.microbatches, "balance": list(self.balance), "batch_size": self.batch,
                "split": self.split, "step_s": r.step_s, "schedule_s": r.schedule_s,
                "images_per_s": self.images_per_s, "bubble": r.bubble.to_dict() if r.bubble else
                {"total": r.bubble_share}, "busy_s": list(r.busy_s), "idle_s": list(r.idle_s),
                "memory_bytes": list(self.memory_bytes), "peak_activation_bytes": list(r.peak_activation_bytes),
                "fits": self.fits, "cross_site_cuts": self.cross_cuts, "messages": r.transfers,
                "books": self.books().to_dict() if r.bubble else None}  # the top plans (split bubbles) only


def splits(layers: Sequence[LayerTimes], stages: int) -> dict[str, tuple[int, ...]]:
    """The splits tried: balanced by time alone, and by the trainer's rule (time share + 0.5 x memory share)."""
    times = [c.forward_s + c.backward_s for c in layers]
    measured = [partition.LayerCost(t, c.param_bytes, c.activation_bytes, c.forward_s, c.weight_s)
                for t, c in zip(times, layers, strict=True)]
    # plan() reads only len(layers) when given costs and no balance: the modules themselves are not needed.
    trainer = partition.plan(cast(Any, [None] * len(layers)), stages, costs=measured).balance
    return {"time": tuple(partition.balance_costs(times, stages)), "time+memory": tuple(trainer)}


def _overhead(overhead: HostOverhead | Callable[[str, int], HostOverhead], schedule: str,
              ranks: int) -> HostOverhead:
    return overhead if isinstance(overhead, HostOverhead) else overhead(schedule, ranks)


def rank_plans(layers_for: Callable[[int], Sequence[LayerTimes]], optimizer_s: float, batch: int,
               network: Network, memory_limit: int | None = None,
               schedules: Sequence[str] | None = None, microbatches: Sequence[int] = (1, 2, 4, 8, 16, 32),
               virtuals: Sequence[int] = (2, 4), top: int = 5,
               skipped: list[str] | None = None,
               overhead: HostOverhead | Callable[[str, int], HostOverhead] = NO_OVERHEAD,
               cores: Cores | None = None) -> list[Candidate]:
    """Simulate every configuration and return them fastest first, those within ``memory_limit`` before others.

    Args:
        layers_for: the layers' costs for a micro-batch of the given size.
        optimizer_s: one optimizer step over the whole model.
        batch: images per step, split into micro-batches (only counts that divide it are tried).
        network: devices and links; 2..devices pipeline ranks are tried.
        memory_limit: bytes per device; ``None``: no limit.
        schedules: the schedules to try; ``None``: every schedule in the table (``stage_runtime/schedules.py``).
        microbatches: the micro-batch counts to try.
        virtuals: the stages per rank to try for the schedules that leave it free (interleaved-1f1b and
            zero-bubble; ZBV always has 2, GPipe and 1F1B 1).
        top: how many of the best get their bubble split into causes (two more simulations each).
        skipped: gets one line per configuration torch refuses, with its reason.
        overhead: the host's cost of torch's runtime per action, message and step (``calibrate_host``), or a
            function of (schedule, pipeline ranks) giving it (a calibration measures each schedule family and
            rank count apart).
        cores: the cores every plan's ranks share (stage processes on one CPU machine); ``None``: a device each.

    Raises:
        ValueError: an unknown schedule (the message lists the known ones), or nothing can be simulated (say, a
            model of one layer).
    """
    # the table as it is now (a schedule added to it is planned), less the one that does not flush
    names = tuple(n for n, s in SCHEDULE_SPECS.items() if s.flush) if schedules is None else tuple(schedules)
    specs = {name: schedule_spec(name) for name in names}  # an unknown name fails before any simulation
    for name, spec in specs.items():
        if not spec.flush:
            raise ValueError(f"schedule {name!r} does not flush, so a step alone does not predict it: "
                             "plan.plan() simulates it over several steps beside the best 1f1b plan")
    out: list[Candidate] = []
    n_layers = len(layers_for(batch))
    for ranks in range(2, network.devices + 1):
        for schedule in names:
            spec = specs[schedule]
            per_ranks = tuple(virtuals) if spec.stages_fixed is None else (spec.stages_fixed,)
            for per_rank in per_ranks:
                stages = ranks * per_rank
                if stages > n_layers:
                    continue
                owner = placement(schedule, ranks, stages)
                cross = sum(network.site(owner[s]) != network.site(owner[s + 1]) for s in range(stages - 1))
                for m in microbatches:
                    if batch % m:
                        continue
                    try:
                        spec.check(ranks, m)
                        order = torch_order(schedule, ranks, m, per_rank)
                    except ValueError as err:
                        if skipped is not None:
                            skipped.append(f"{schedule} S={ranks} V={per_rank} M={m}: {err}")
                        continue
                    layers = layers_for(batch // m)
                    for how, balance in splits(layers, stages).items():
                        if any(c.balance == balance and c.schedule == schedule and c.ranks == ranks
                               and c.virtual == per_rank and c.microbatches == m for c in out):
                            continue  # both rules chose the same split
                        costs = stage_costs(layers, balance, optimizer_s)
                        result = simulate_step(order, owner, costs, network.between, causes=False,
                                               overhead=_overhead(overhead, schedule, ranks), cores=cores)
                        memory = [0] * ranks
                        for s, r in enumerate(owner):
                            memory[r] += STATE_COPIES * costs[s].param_bytes
                        memory = [a + b for a, b in zip(memory, result.peak_activation_bytes, strict=True)]
                        fits = memory_limit is None or max(memory) <= memory_limit
                        out.append(Candidate(schedule, ranks, per_rank, m, balance, how, batch, result,
                                             tuple(memory), fits, cross, tuple(costs)))
    if not out:
        raise ValueError(f"no configuration could be simulated for a model of {n_layers} layers on "
                         f"{network.devices} devices; a pipeline needs at least 2 layers and 2 devices")
    out.sort(key=lambda c: (not c.fits, c.result.step_s, max(c.memory_bytes)))
    for i, c in enumerate(out[:top]):
        order = torch_order(c.schedule, c.ranks, c.microbatches, c.virtual)
        owner = placement(c.schedule, c.ranks, c.ranks * c.virtual)
        full = simulate_step(order, owner, c.costs, network.between, causes=True,
                             overhead=_overhead(overhead, c.schedule, c.ranks), cores=cores)
        out[i] = Candidate(c.schedule, c.ranks, c.virtual, c.microbatches, c.balance, c.split, c.batch, full,
                           c.memory_bytes, c.fits, c.cross_cuts, c.costs)
    return out
