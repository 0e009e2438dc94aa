"""``bench balance``'s books: what each unit (a rank's micro-batch) of each step holds, what it costs, and the step.

A unit's pieces are read back from what the Loader delivered (each run of real tokens of one document with
consecutive ``position_ids`` in a row is a piece: a document, or a long one's piece) or from a plan's packs (the
planner's rows, placed as the Loader places them). Both give :class:`Units`, whose cost is the simulated
accelerator's::

    a unit costs  cost.linear * tokens + cost.quadratic * sum(piece**2) + cost.image * images   (padding free)
    a step takes  sum over micro-batch slots m of max over ranks r of unit (r, m)      (ranks in lockstep)
    ideal         the epoch's total cost / ranks                                       (every unit as busy as any)

With one micro-batch (data parallelism) a step is its slowest rank, as at the gradient all-reduce. With M > 1 a
pipeline's stage waits for the slowest micro-batch: the ranks run micro-batch m together, so slot m lasts as long
as its costliest unit; the fill-and-drain bubble, the same whatever the balance, is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from stallfree.core.cost import Cost

__all__ = ["Pieces", "Units", "delivered_pieces", "delivered_units", "planned_units"]


@dataclass(frozen=True)
class Pieces:
    """The pieces of one unit: each one's document (dataset row), tokens and whether it is its document's start."""

    rows: np.ndarray  # int64
    tokens: np.ndarray  # int64
    first: np.ndarray  # bool

    def cost(self, cost: Cost, images: np.ndarray | None) -> float:
        """The unit's cost: its pieces' tokens and squares, and the images of the documents it starts."""
        n = self.tokens.astype(np.float64)
        total = cost.linear * n.sum() + cost.quadratic * (n * n).sum()
        if images is not None and cost.image:
            total += cost.image * float(images[self.rows[self.first]].sum())
        return float(total)


@dataclass(frozen=True)
class Units:
    """An epoch's units: ``steps[s][r][m]`` is rank ``r``'s micro-batch ``m`` of step ``s``."""

    steps: list[list[list[Pieces]]]

    def costs(self, cost: Cost, images: np.ndarray | None) -> np.ndarray:
        """Every unit's cost, ``[steps, ranks, microbatches]``."""
        return np.asarray([[[u.cost(cost, images) for u in rank] for rank in step] for step in self.steps],
                          np.float64).reshape(len(self.steps), -1, len(self.steps[0][0]) if self.steps else 1)

    def tokens(self) -> np.ndarray:
        """Every unit's tokens, ``[steps, ranks, microbatches]``."""
        return np.asarray([[[int(u.tokens.sum()) for u in rank] for rank in step] for step in self.steps],
                          np.int64).reshape(len(self.steps), -1, len(self.steps[0][0]) if self.steps else 1)

    def check_once(self, lengths: np.ndarray) -> None:
        """Every document's tokens once: as many tokens as its length, and one start.

        Raises:
            RuntimeError: a document delivered short, twice or not at all (named by row).
        """
        flat = [u for step in self.steps for rank in step for u in rank]
        rows = np.concatenate([u.rows for u in flat]) if flat else np.zeros(0, np.int64)
        tokens = np.bincount(rows, np.concatenate([u.tokens for u in flat]) if flat else None, len(lengths))
        starts = np.bincount(rows[np.concatenate([u.first for u in flat])] if flat else rows, minlength=len(lengths))
        wrong = np.flatnonzero((tokens != lengths) | (starts != 1))
        if len(wrong):
            row = int(wrong[0])
            raise RuntimeError(f"document {row} ({int(lengths[row])} tokens) came as {int(tokens[row])} tokens in "
                               f"{int(starts[row])} starts ({len(wrong)} documents wrong): not every document once")

    def padding(self, slots_per_unit: int) -> float:
        """The share of the slots delivered that hold no token."""
        tokens = self.tokens()
        return 1.0 - float(tokens.sum()) / (tokens.size * slots_per_unit) if tokens.size else 0.0


def delivered_pieces(batch: Mapping[str, object], microbatches: int) -> list[Pieces]:
    """A delivered batch's units, micro-batch by micro-batch (rows ``[m*B/M, (m+1)*B/M)`` are micro-batch m)."""
    doc = np.asarray(batch["document_index"])
    pos = np.asarray(batch["position_ids"])
    per = doc.shape[0] // microbatches
    out = []
    for m in range(microbatches):
        d, p = doc[m * per : (m + 1) * per], pos[m * per : (m + 1) * per]
        start = np.ones(d.shape, bool)  # a row's first token starts a piece
        start[:, 1:] = (d[:, 1:] != d[:, :-1]) | (p[:, 1:] != p[:, :-1] + 1)
        real = d >= 0
        start &= real
        piece = np.cumsum(start.ravel()) - 1  # every real token's piece: the last start at or before it
        tokens = np.bincount(piece[real.ravel()], minlength=int(start.sum()))
        out.append(Pieces(d.ravel()[start.ravel()].astype(np.int64), tokens.astype(np.int64),
                          p.ravel()[start.ravel()] == 0))
    return out


def delivered_units(ranks: Sequence[Iterable[list[Pieces]]]) -> Units:
    """The units of every rank's batches (each batch's :func:`delivered_pieces`), step by step.

    Raises:
        RuntimeError: the ranks delivered different numbers of batches.
    """
    per_rank = [list(batches) for batches in ranks]
    if len({len(b) for b in per_rank}) > 1:
        raise RuntimeError(f"the ranks delivered {[len(b) for b in per_rank]} batches: not the same number")
    return Units([list(step) for step in zip(*per_rank, strict=True)])


def planned_units(packs: Sequence[Sequence[tuple[int, int, int]]], rows: int, world_size: int, batch_size: int,
                  microbatches: int) -> Units:
    """A plan's packs (global position order; pieces ``(virtual, begin, end)``) in the units the Loader deals them to.

    Pack position ``p`` of step ``s`` is rank ``p % W``'s row ``p // W`` of that step, as the sampler deals packs;
    the last step is filled with empty rows.
    """
    per_step, per = world_size * batch_size, batch_size // microbatches
    steps = -(-len(packs) // per_step)
    cells: list[list[list[list[tuple[int, int, int]]]]] = [
        [[[] for _ in range(microbatches)] for _ in range(world_size)] for _ in range(steps)]
    for p, pack in enumerate(packs):
        s, at = divmod(p, per_step)
        i, r = divmod(at, world_size)
        cells[s][r][i // per].extend(pack)

    def unit(pieces: list[tuple[int, int, int]]) -> Pieces:
        a = np.asarray(pieces, np.int64).reshape(-1, 3)
        return Pieces(a[:, 0] % rows, a[:, 2] - a[:, 1], a[:, 1] == 0)

    return Units([[[unit(m) for m in rank] for rank in step] for step in cells])
