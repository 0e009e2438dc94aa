"""Balance: each global step's documents placed so that no rank and no micro-batch waits for another.

Packing evens the tokens per row, not the work: attention grows with the square of each document's length, so two
full rows can differ several times in compute, and every rank waits at the gradient all-reduce for the slowest (a
pipeline, for its slowest micro-batch). The Loader knows every length before the epoch starts and owns the order,
so each rank computes the same balanced plan, with no communication::

    a global step = W ranks x M micro-batches ("units") of B/M rows of S tokens each
    documents of the epoch's order, in turn ─► the step's candidates (about its W*B*S tokens; what does not fit
                                               goes first into the next step)
    largest cost first ─► the unit with the least cost so far that has a row with room ─► its fullest such row

(longest-processing-time assignment, the rows filled best-fit inside a unit). ``balance="tokens"`` evens tokens,
``"compute"`` evens :class:`~stallfree.core.cost.Cost`. The plan is a pure function of the seed, the epoch, the
lengths and the world size it was planned for, so exactly-once delivery and bit-exact resume hold as for plain
packing; a state resumed on another world size finishes its epoch on the packs planned for the old one (each once,
balanced for the old ranks), and the next epoch is planned for the new.

Rank ``r``'s batch of step ``s`` is its rows in micro-batch order: rows ``[m*B/M, (m+1)*B/M)`` are micro-batch
``m`` (torch's pipelining splits a batch along its first dimension in that order).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np

from stallfree.core.cost import Cost

__all__ = ["FULL", "SLACK", "Balance", "balanced_packs"]

#: How far over the step's pace (its costliest unit's first piece) a unit may go for one more piece.
SLACK = 0.02
#: A step holding less than this share of its token slots waits for the next window's documents (but the last).
FULL = 0.5


@dataclass(frozen=True)
class Balance:
    """What the balance planned: each step's cost per unit, and how long planning took.

    ``costs[step, unit]``: unit ``r * M + m`` is rank ``r``'s micro-batch ``m``.
    """

    costs: np.ndarray
    seconds: float

    def max_over_mean(self) -> np.ndarray:
        """Each step's slowest unit over its mean (1.0: perfectly even)."""
        mean = self.costs.mean(axis=1)
        return np.divide(self.costs.max(axis=1), mean, out=np.ones_like(mean), where=mean > 0)


Piece = tuple[int, int, int]  # (virtual id, begin, end)


def balanced_packs(order: np.ndarray, lengths: np.ndarray, rows: int, *, seq_len: int, batch_size: int,
                   microbatches: int, world_size: int, cost: Cost, window: int = 1000,
                   group: bool = True) -> tuple[list[list[Piece]], Balance]:
    """The epoch's packs in global position order (step by step, each rank's rows in micro-batch order).

    ``order`` holds the documents' virtual ids (their row's length is ``lengths[v % rows]``, already cut by the
    caller's ``long`` rule); a document longer than ``seq_len`` comes as pieces of ``seq_len`` and a remainder.
    ``group``: documents of a window are taken costliest first, so that like meets like in a step (``"compute"``);
    else in the epoch's order, a step's worth at a time, each step's units evened (``"tokens"``).
    """
    started = time.perf_counter()
    per_unit, units = batch_size // microbatches, world_size * microbatches
    step_tokens = world_size * batch_size * seq_len
    packs: list[list[Piece]] = []
    step_costs: list[list[float]] = []
    carried: list[Piece] = []
    everything = pieces(order, lengths, rows, seq_len)
    for lo in range(0, len(everything), window):
        last = lo + window >= len(everything)
        todo = carried + everything[lo : lo + window]
        if group:
            todo.sort(key=lambda p: (-cost.document(p[2] - p[1]), p[0], p[1]))
        carried = []
        while todo:
            if not group:  # a step's worth of the order, costliest first
                cut, tokens = 0, 0
                while cut < len(todo) and tokens < step_tokens:
                    tokens, cut = tokens + todo[cut][2] - todo[cut][1], cut + 1
                todo[:cut] = sorted(todo[:cut], key=lambda p: (-cost.document(p[2] - p[1]), p[0], p[1]))
            step, spent, todo = _step(todo, units, per_unit, seq_len, cost)
            if not last and sum(p[2] - p[1] for u in step for row in u for p in row) < step_tokens * FULL:
                carried = [p for u in step for row in u for p in row] + todo  # a thin step: with the next window
                break
            positions: list[list[Piece]] = [[] for _ in range(world_size * batch_size)]
            for u, unit in enumerate(step):
                r, m = divmod(u, microbatches)
                for j, row in enumerate(unit):
                    positions[(m * per_unit + j) * world_size + r] = row  # rank r's row i sits at global r + i * W
            packs.extend(positions)
            step_costs.append(spent)
    costs = np.asarray(step_costs, np.float64).reshape(-1, units)
    return packs, Balance(costs, time.perf_counter() - started)


def _step(todo: list[Piece], units: int, per_unit: int, seq_len: int,
          cost: Cost) -> tuple[list[list[list[Piece]]], list[float], list[Piece]]:
    """One step's units from ``todo`` (costliest first): what they hold, their costs, and what is left (in order).

    The costliest pieces open the units, one each; the step's pace is what its costliest unit would cost with its
    rows filled by the cheapest work there is (tokens at the linear cost). Then every unit takes the next pieces
    that fit its rows while its cost stays within the pace (the cheapest unit first): units of cheap documents fill
    their rows, and a costly document's unit does not take more than its share, so the units of a step cost alike
    as far as their rows allow. Documents sorted by cost over a window meet their like in the same steps.
    """
    rows: list[list[list[Piece]]] = [[[] for _ in range(per_unit)] for _ in range(units)]
    room = [[(seq_len, j) for j in range(per_unit)] for _ in range(units)]
    spent = [0.0] * units
    left: list[Piece] = []
    pace = float("inf")
    for k, piece in enumerate(todo):
        size, price = piece[2] - piece[1], cost.document(piece[2] - piece[1])
        u = k if k < units else _unit(spent, room, size, price, pace)
        if u < 0:
            left.append(piece)
            continue
        at = bisect.bisect_left(room[u], (size, -1))  # the fullest row of the unit that holds it
        free, j = room[u].pop(at)
        rows[u][j].append(piece)
        if free > size:
            bisect.insort(room[u], (free - size, j))
        spent[u] += price
        if k == units - 1:  # the pace: the costliest unit, its rows filled with the cheapest work there is
            pace = max(spent[v] + cost.linear * sum(free for free, _ in room[v]) for v in range(units)) * (1 + SLACK)
    return rows, spent, left


def _unit(spent: list[float], room: list[list[tuple[int, int]]], size: int, price: float, pace: float) -> int:
    """The cheapest unit with a row that holds ``size`` tokens and a cost that stays within ``pace``; -1 if none."""
    best = -1
    for u in range(len(spent)):
        if room[u] and room[u][-1][0] >= size and spent[u] + price <= pace and (best < 0 or spent[u] < spent[best]):
            best = u
    return best


def pieces(order: np.ndarray, lengths: np.ndarray, rows: int, seq_len: int) -> list[Piece]:
    """The documents of ``order`` as pieces of at most ``seq_len`` tokens, in order (a long one's pieces in order)."""
    out: list[Piece] = []
    for v in order.tolist():
        n = int(lengths[v % rows])
        out.extend((v, k, min(k + seq_len, n)) for k in range(0, n, seq_len))
    return out
