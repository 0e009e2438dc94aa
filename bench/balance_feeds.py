"""``bench balance``'s contenders: the Loader packing a mix with each balance.

Each contender's epoch is read back into units (:mod:`.balance_units`).

``none``, ``tokens``, ``compute``: one ``stallfree.Loader`` per rank with ``Packing(seq_len=S, balance=...,
cost=..., microbatches=M)``, shuffled with the run's seed, every batch of the epoch delivered and its units read from
``document_index``/``position_ids``. The chat mix comes from :class:`GeneratedDocuments`; the image-text mix from
image-text shards (:mod:`.balance_images`), with ``Packing(image_tokens=, image_token_id=)``, so the Loader knows
each document's images and its ``"compute"`` charges them ``Cost.image`` (as in training). Its planning time: the
plan's ``balance.seconds`` (``loader.sampler.plan(epoch).balance``; for ``none`` the plain packing of the same order,
:func:`~stallfree.pipeline.packing.pack`, timed here), and the same plan made again here, by the function the
Loader's plan calls with the lengths and image counts its sampler holds, in this thread's CPU seconds (on a shared
machine the wall time counts other jobs' turns too).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stallfree.bench.balance_images import IMAGE_TOKEN_ID, image_text_loader_options
from stallfree.bench.balance_mixes import MixDraw
from stallfree.bench.balance_units import Units, delivered_pieces, delivered_units
from stallfree.core.cost import Cost
from stallfree.ingest.fields import TOKEN_FIELDS, Field
from stallfree.pipeline.loader_sampler import LoaderPacks
from stallfree.pipeline.packing import balanced_plan, pack
from stallfree.pipeline.reader_base import BaseReader

__all__ = ["CONTENDERS", "Fed", "GeneratedDocuments", "feed"]

#: name: what the table calls it
CONTENDERS = {
    "none": "balance=None (plain packing)",
    "tokens": 'balance="tokens"',
    "compute": 'balance="compute"',
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


def feed(name: str, mix: MixDraw, source: Any, *, seq_len: int, batch_size: int, world_size: int,
         microbatches: int, cost: Cost, seed: int) -> Fed:
    """Contender ``name`` over ``mix`` read from ``source`` (epoch 0 of the Loader's order of ``seed``).

    ``source``: what the Loader reads, a :class:`GeneratedDocuments` of the mix's lengths, or (a mix with images)
    the image-text shard folder :func:`~.balance_images.write_mix` wrote.

    Raises:
        ValueError: no contender ``name``.
    """
    import stallfree

    if name not in CONTENDERS:
        raise ValueError(f"no contender {name!r}; the contenders are {', '.join(CONTENDERS)}")
    balance: Literal["tokens", "compute"] | None = (None if name == "none" else "tokens" if name == "tokens" else
                                                    "compute")
    images = mix.image_tokens > 0
    packing = stallfree.Packing(seq_len=seq_len, balance=balance, cost=cost if balance == "compute" else None,
                                microbatches=microbatches, image_tokens=mix.image_tokens if images else None,
                                image_token_id=IMAGE_TOKEN_ID if images else None)
    options = image_text_loader_options() if images else {}

    def loader(rank: int) -> stallfree.Loader:
        return stallfree.Loader(source, batch_size, packing=packing, shuffle=True, seed=seed, rank=rank,
                                world_size=world_size, **options)

    with loader(0) as first:
        sampler = first.sampler
        if not isinstance(sampler, LoaderPacks):
            raise TypeError(f"a packed Loader's sampler is a LoaderPacks, got {type(sampler).__name__}")
        order = sampler.documents.virtual_order(0)
        plan = sampler.plan(0)

    rows = sampler.num_rows
    started, cpu = time.perf_counter(), time.thread_time()
    if balance is None:  # what the Loader's plan runs: its lengths (image positions counted) and image counts
        pack(order, sampler.lengths, packing, rows)
    else:
        balanced_plan(order, sampler.lengths, packing, rows, batch_size, world_size, sampler.images)
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
    ranks = []
    for rank in range(world_size):
        with loader(rank) as each:
            ranks.append([delivered_pieces(batch, microbatches) for batch in each])
    if plan.balance is not None:
        return Fed(delivered_units(ranks), plan.balance.seconds, cpu, plan.balance.costs)
    return Fed(delivered_units(ranks), wall, cpu, None)
