"""Batching, the stage between the sampler's order and the graph: what a batch is, and where a pass stands.

The sampler deals each rank a stream of samples (:mod:`.sampler`); a batcher cuts the stream into batches and
keeps the pass's :class:`Cursor`. The epoch run asks it how many batches a pass over ``per_rank`` samples makes and
how many samples batch ``k`` takes from the stream (:meth:`Batcher.size`); the pass asks it where the stream stands
after each delivery; ``len(loader)``, ``set_epoch`` and resume read it. Its state nests in the Loader's under
``"batcher"``: a batcher brings its own fields and checks them, and no other part reads them.

:class:`CountBatcher` is the image batcher: ``batch_size`` samples a batch, the last one short (or dropped with
``drop_last``), each batch delivered ``echo`` times (``echo_mode="batch"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from stallfree.core.resume import state_int, state_mapping

__all__ = ["Batcher", "CountBatcher", "Cursor"]

_OWNER = "Loader"


@dataclass(frozen=True)
class Cursor:
    """Where a pass stands, after the last batch delivered to the training loop (never one prefetched).

    Attributes:
        position: the rank's stream position where the next batch to make starts (for a batch between its echoed
            repeats, where that batch starts).
        repeat: repeats of the current batch already delivered (``echo_mode="batch"``; else 0).
        delivered: batches delivered in this pass's epoch, repeats included.
    """

    position: int = 0
    repeat: int = 0
    delivered: int = 0


class Batcher(Protocol):
    """What a batch is: how many a pass makes, how many samples each takes, how a delivery moves the cursor."""

    @property
    def largest(self) -> int:
        """The most samples a batch takes (the graph's batch size)."""
        ...

    def batches(self, per_rank: int) -> int:
        """Batches a pass over ``per_rank`` samples makes (each delivered :attr:`echo` times)."""
        ...

    def size(self, number: int, per_rank: int) -> int:
        """Samples batch ``number`` of a pass over ``per_rank`` samples takes from the stream."""
        ...

    def deliveries(self, per_rank: int) -> int:
        """Batches a pass over ``per_rank`` samples delivers, repeats included: ``len(loader)``."""
        ...

    def number(self, cursor: Cursor) -> int:
        """The batch the pass makes next (or, between repeats, the one it repeats)."""
        ...

    def after(self, cursor: Cursor, start: int, end: int) -> Cursor:
        """``cursor`` after one more delivery of the batch that spans stream positions ``[start, end)``."""
        ...

    def samples_before(self, cursor: Cursor, per_rank: int) -> int:
        """Samples the batches delivered before ``cursor`` hold (skipped positions not counted)."""
        ...

    def state_dict(self, cursor: Cursor) -> dict[str, int]:
        """``cursor`` as the ``"batcher"`` part of the Loader's state."""
        ...

    def load_cursor(self, state: Mapping[str, Any], per_rank: int) -> Cursor:
        """The cursor of a ``"batcher"`` state, each field checked (:class:`ValueError` naming it)."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """What decides which samples each batch holds."""
        ...


@dataclass(frozen=True)
class CountBatcher:
    """``batch_size`` samples a batch, the last one short or dropped (``drop_last``), each delivered ``echo`` times."""

    batch_size: int
    drop_last: bool = False
    echo: int = 1

    @property
    def largest(self) -> int:
        return self.batch_size

    def batches(self, per_rank: int) -> int:
        return per_rank // self.batch_size if self.drop_last else math.ceil(per_rank / self.batch_size)

    def size(self, number: int, per_rank: int) -> int:
        if number < self.batches(per_rank) - 1 or self.drop_last:
            return self.batch_size
        return per_rank - number * self.batch_size

    def deliveries(self, per_rank: int) -> int:
        return self.batches(per_rank) * self.echo

    def number(self, cursor: Cursor) -> int:
        return (cursor.delivered - cursor.repeat) // self.echo

    def after(self, cursor: Cursor, start: int, end: int) -> Cursor:
        if cursor.repeat + 1 < self.echo:
            return Cursor(start, cursor.repeat + 1, cursor.delivered + 1)
        return Cursor(end, 0, cursor.delivered + 1)

    def samples_before(self, cursor: Cursor, per_rank: int) -> int:
        return min(self.number(cursor) * self.batch_size, per_rank)

    def state_dict(self, cursor: Cursor) -> dict[str, int]:
        return {"position": cursor.position, "repeat": cursor.repeat, "batches": cursor.delivered}

    def load_cursor(self, state: Mapping[str, Any], per_rank: int) -> Cursor:
        part = state_mapping(_OWNER, state)
        echo, total = self.echo, self.batches(per_rank)
        delivered = state_int(_OWNER, part, "batches", high=total * echo, name="batcher.batches",
                              why=f" (an epoch of {per_rank} samples per rank in batches of {self.batch_size}"
                                  + (f", each delivered echo={echo} times)" if echo > 1 else ")"))
        repeat = state_int(_OWNER, part, "repeat", high=echo - 1, name="batcher.repeat",
                           why=f" (repeats of a batch delivered echo={echo} times, echo_mode='batch')" if echo > 1
                           else " (each batch is delivered once: echo_mode='batch' with echo > 1 repeats it)")
        if (delivered - repeat) % echo:
            raise ValueError(f"Loader state has batcher.repeat={repeat} but batcher.batches={delivered}: each batch "
                             f"is delivered echo={echo} times, so batches - repeat is a multiple of {echo}")
        return Cursor(state_int(_OWNER, part, "position", name="batcher.position"), repeat, delivered)

    def fingerprint(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "drop_last": self.drop_last}
