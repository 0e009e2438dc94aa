"""``bench balance``'s contenders: the Loader packing a mix with each balance, and the planner knowing images.

Each contender's epoch is read back into units (:mod:`.balance_units`).

- ``none``, ``tokens``, ``compute``: one ``stallfree.Loader`` per rank over :class:`GeneratedDocuments` with
  ``Packing(seq_len=S, balance=..., cost=..., microbatches=M)``, shuffled with the run's seed, every batch of the
  epoch delivered and its units read from ``document_index``/``position_ids``. Its planning time: the plan's
  ``balance.seconds`` (``loader.sampler.plan(epoch).balance``; for ``none`` the plain packing of the same order,
  :func:`~stallfree.pipeline.packing.pack`, timed here), and the same plan made again here in this thread's CPU
  seconds (on a shared machine the wall time counts other jobs' turns too).
- ``compute+images``: the balance's planner (:func:`~stallfree.pipeline.balance.balanced_packs`, what the Loader's
  ``"compute"`` runs) over the same order with every document's image count, which the Loader cannot pass yet (it
  has no image-text samples); its packs are placed in units as the Loader deals them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from stallfree.bench.balance_mixes import MixDraw
from stallfree.bench.balance_units import Units, delivered_pieces, delivered_units, planned_units
from stallfree.core.cost import Cost
from stallfree.ingest.fields import TOKEN_FIELDS, Field
from stallfree.pipeline.balance import Balance, balanced_packs
from stallfree.pipeline.loader_sampler import LoaderPacks
from stallfree.pipeline.packing import pack
from stallfree.pipeline.reader_base import BaseReader

__all__ = ["CONTENDERS", "Fed", "GeneratedDocuments", "feed"]

#: name: what the table calls it
CONTENDERS = {
    "none": "balance=None (plain packing)",
    "tokens": 'balance="tokens"',
    "compute": 'balance="compute"',
    "compute+images": 'balance="compute", images known (planner)',
}


class GeneratedDocuments(BaseReader):
    """An in-memory token source of given lengths (``Loader(GeneratedDocuments(lengths, name), ...)``); ids are 1."""

    fields: Sequence[Field] = TOKEN_FIELDS
    encoded = False

    def __init__(self, lengths: np.ndarray, name: str):
        super().__init__()
        self.classes: list[str] = []
        self.name = name
        self._lengths = np.asarray(lengths, np.int64)
        self._ones = np.ones(int(self._lengths.max(initial=1)), np.int32)

    def __len__(self) -> int:
        return len(self._lengths)

    def labels(self) -> np.ndarray:
        """No labels: zeros."""
        return np.zeros(len(self._lengths), np.int64)

    def lengths(self) -> np.ndarray:
        """Every document's length, in tokens."""
        return self._lengths

    def read(self, index: int) -> dict[str, np.ndarray]:
        """Document ``index``: its length's worth of id 1."""
        return {"tokens": self._ones[: self._lengths[index]]}

    def describe(self, index: int) -> str:
        """How errors name a document."""
        return f"{self.name} document {index}"


@dataclass(frozen=True)
class Fed:
    """What a contender delivered: its units, its planning seconds and a balance's planned unit costs per step."""

    units: Units
    plan_seconds: float  # wall: the plan's balance.seconds (plain packing: timed here)
    plan_cpu_seconds: float  # the same plan made again here, in this thread's CPU seconds
    planned: np.ndarray | None  # [steps, W*M] (loader.sampler.plan(epoch).balance.costs), or None


def feed(name: str, mix: MixDraw, label: str, *, seq_len: int, batch_size: int, world_size: int,
         microbatches: int, cost: Cost, seed: int) -> Fed:
    """Contender ``name`` over ``mix`` (epoch 0 of the Loader's order of ``seed``).

    Raises:
        ValueError: no contender ``name``.
    """
    import stallfree

    if name not in CONTENDERS:
        raise ValueError(f"no contender {name!r}; the contenders are {', '.join(CONTENDERS)}")
    balance: Literal["tokens", "compute"] | None = (None if name == "none" else "tokens" if name == "tokens" else
                                                    "compute")
    packing = stallfree.Packing(seq_len=seq_len, balance=balance, cost=cost if balance == "compute" else None,
                                microbatches=microbatches)
    source = GeneratedDocuments(mix.lengths, label)

    def loader(rank: int) -> stallfree.Loader:
        return stallfree.Loader(source, batch_size, packing=packing, shuffle=True, seed=seed, rank=rank,
                                world_size=world_size)

    with loader(0) as first:
        sampler = first.sampler
        if not isinstance(sampler, LoaderPacks):
            raise TypeError(f"a packed Loader's sampler is a LoaderPacks, got {type(sampler).__name__}")
        order = sampler.documents.virtual_order(0)
        plan = sampler.plan(0)
    images = mix.images if name == "compute+images" else None

    def replan() -> tuple[list[list[tuple[int, int, int]]], Balance | None]:
        """What the Loader's plan runs (the planner, or plain packing), with the images where they are known."""
        if balance is None:
            pack(order, mix.lengths, packing, len(mix.lengths))
            return [], None
        return balanced_packs(order, mix.lengths, len(mix.lengths), seq_len=seq_len, batch_size=batch_size,
                              microbatches=microbatches, world_size=world_size, cost=packing.unit_cost,
                              window=packing.window, group=balance == "compute", images=images)

    started, cpu = time.perf_counter(), time.thread_time()
    packs, planned = replan()  # timed here in CPU seconds too: a shared machine's wall time is other jobs' as well
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
    if name == "compute+images" and planned is not None:
        units = planned_units(packs, len(mix.lengths), world_size, batch_size, microbatches)
        return Fed(units, planned.seconds, cpu, planned.costs)
    ranks = []
    for rank in range(world_size):
        with loader(rank) as each:
            ranks.append([delivered_pieces(batch, microbatches) for batch in each])
    if plan.balance is not None:
        return Fed(delivered_units(ranks), plan.balance.seconds, cpu, plan.balance.costs)
    return Fed(delivered_units(ranks), wall, cpu, None)
