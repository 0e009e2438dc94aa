"""Balance: each global step's documents placed so that no rank and no micro-batch waits for another.

Packing evens the tokens per row, not the work: attention grows with the square of each document's length, so two
full rows can differ several times in compute, and every rank waits at the gradient all-reduce for the slowest (a
pipeline, for its slowest micro-batch). The Loader knows every length before the epoch starts and owns the order,
so each rank computes the same balanced plan, with no communication::

    a global step = W ranks x M micro-batches ("units") of B/M rows of S tokens each
    "compute": a window of the epoch's order (``Packing(window=)``), costliest first ─► as many full steps as its
               tokens fill, made three ways, the way whose units wait least kept:
               - spread: each document to the unit (of all those steps) with the least cost so far that has a row
                 with room, into its fullest such row;
               - ahead:  the same, counting what a unit's empty room will cost once filled at the mean rate left;
               - paced:  step by step, like with like, each unit held to the step's pace (see _step);
               then each step's costliest unit moves or swaps a document with a cheaper unit while that evens them,
               and in the way kept also swaps one document for two of one row (:mod:`.balance_refine`); with
               micro-batches, a step's units are dealt to the slots like with like (each slot's ranks wait least).
               What no step holds goes first into the next window; the last window makes every step.
    "tokens":  a step's worth of the epoch's order at a time, its units evened by tokens (paced).

``"compute"`` evens :class:`~stallfree.core.cost.Cost` (with each document's images where the caller gives them);
no step leaves rows empty for the sake of balance but the last ones, so an epoch has about as many steps as with
``"tokens"``. The plan is a pure function of the seed, the epoch, the lengths and the world size it was planned for,
so exactly-once delivery and bit-exact resume hold as for plain packing; a state resumed on another world size
finishes its epoch on the packs planned for the old one (each once, balanced for the old ranks), and the next epoch
is planned for the new.

Rank ``r``'s batch of step ``s`` is its rows in micro-batch order: rows ``[m*B/M, (m+1)*B/M)`` are micro-batch
``m`` (torch's pipelining splits a batch along its first dimension in that order).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stallfree.core.cost import Cost
from stallfree.pipeline.balance_refine import deal_slots, refine

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
Step = tuple[list[list[list[Piece]]], list[float]]  # each unit's rows of pieces, and each unit's cost


def balanced_packs(order: np.ndarray, lengths: np.ndarray, rows: int, *, seq_len: int, batch_size: int,
                   microbatches: int, world_size: int, cost: Cost, window: int = 1000,
                   group: bool = True, images: np.ndarray | None = None) -> tuple[list[list[Piece]], Balance]:
    """The epoch's packs in global position order (step by step, each rank's rows in micro-batch order).

    ``order`` holds the documents' virtual ids (their row's length is ``lengths[v % rows]``, already cut by the
    caller's ``long`` rule); a document longer than ``seq_len`` comes as pieces of ``seq_len`` and a remainder.
    ``group``: documents of a window are taken costliest first, so that like meets like in a step (``"compute"``);
    else in the epoch's order, a step's worth at a time, each step's units evened (``"tokens"``).
    ``images``: each row's image count (``None``: none), charged ``cost.image`` each on the document's first piece.
    """
    started = time.perf_counter()
    per_unit, units = batch_size // microbatches, world_size * microbatches
    step_tokens = world_size * batch_size * seq_len
    packs: list[list[Piece]] = []
    step_costs: list[list[float]] = []
    carried: list[Piece] = []
    everything = pieces(order, lengths, rows, seq_len)

    counts = images.tolist() if images is not None else None
    prices = {p: cost.document(p[2] - p[1], counts[p[0] % rows] if counts is not None and p[1] == 0 else 0)
              for p in everything}  # each piece's cost, once
    price = prices.__getitem__

    for lo in range(0, len(everything), window):
        last = lo + window >= len(everything)
        todo = carried + everything[lo : lo + window]
        if group:
            todo.sort(key=lambda p: (-price(p), p[0], p[1]))
        carried = []
        while todo:
            if group:  # the window's steps at once: every step gets its share of costly and of cheap documents
                tokens = sum(p[2] - p[1] for p in todo)
                n = -(-tokens // step_tokens) if last else tokens // step_tokens
                if n == 0:  # less than a step's worth: with the next window
                    carried = todo
                    break
                steps, todo = _best_steps(todo, n, units, per_unit, seq_len, cost.linear, price, step_tokens)
            else:  # a step's worth of the order, costliest first
                cut, tokens = 0, 0
                while cut < len(todo) and tokens < step_tokens:
                    tokens, cut = tokens + todo[cut][2] - todo[cut][1], cut + 1
                todo[:cut] = sorted(todo[:cut], key=lambda p: (-price(p), p[0], p[1]))
                step, spent, todo = _step(todo, units, per_unit, seq_len, cost.linear, price, step_tokens)
                if not last and sum(p[2] - p[1] for u in step for row in u for p in row) < step_tokens * FULL:
                    carried = [p for u in step for row in u for p in row] + todo  # a thin step: with the next window
                    break
                steps = [(step, spent)]
            for step, spent in steps:
                if group and microbatches > 1:  # like with like in each micro-batch slot
                    dealt = deal_slots(spent, world_size, microbatches)
                    step, spent = [step[u] for u in dealt], [spent[u] for u in dealt]
                positions: list[list[Piece]] = [[] for _ in range(world_size * batch_size)]
                for u, unit in enumerate(step):
                    r, m = divmod(u, microbatches)
                    for j, row in enumerate(unit):
                        positions[(m * per_unit + j) * world_size + r] = row  # rank r's row i: global r + i * W
                packs.extend(positions)
                step_costs.append(spent)
            if group and not last:
                carried = todo  # what did not fit: the cheapest, first in the next window's steps
                break
    costs = np.asarray(step_costs, np.float64).reshape(-1, units)
    return packs, Balance(costs, time.perf_counter() - started)


def _best_steps(todo: list[Piece], n: int, units: int, per_unit: int, seq_len: int, linear: float,
                price: Callable[[Piece], float], step_tokens: int) -> tuple[list[Step], list[Piece]]:
    """``n`` steps of ``todo`` (costliest first), and what they left: the best of three ways.

    Each way's steps are evened by :func:`~.balance_refine.refine` (one for one); the way whose units wait least
    (the sum over steps of the costliest unit's excess over the mean) wins, ties to the first. The ways:
    :func:`_spread` over all ``n`` steps' units at once, the same looking ahead, and :func:`_step` step by step
    (like documents together); no one of them is best on every mix. The way kept is evened further, one document
    for two as well.
    """
    tries = []
    for how in ("spread", "ahead", "paced"):
        if how == "paced":
            steps, rest = [], todo
            for _ in range(n):
                step, spent, rest = _step(rest, units, per_unit, seq_len, linear, price, step_tokens)
                steps.append((step, spent))
        else:
            (made, costs), rest = _spread(todo, n * units, per_unit, seq_len, price, how == "ahead")
            steps = [(made[k : k + units], costs[k : k + units]) for k in range(0, n * units, units)]
        for step, spent in steps:
            refine(step, spent, seq_len, price, 4 * units, pairs=False)
        waste = sum(max(spent) - sum(spent) / units for _, spent in steps)  # the units' wait
        tries.append((waste, len(rest), steps, rest))
    _, _, steps, rest = min(tries, key=lambda t: t[:2])
    for step, spent in steps:  # the way kept: its costliest units also exchange one document for two
        refine(step, spent, seq_len, price, 8 * units)
    return steps, rest


def _step(todo: list[Piece], units: int, per_unit: int, seq_len: int, linear: float, price: Callable[[Piece], float],
          step_tokens: int) -> tuple[list[list[list[Piece]]], list[float], list[Piece]]:
    """One step's units from ``todo`` (costliest first): what they hold, their costs, and what is left (in order).

    The costliest pieces open the units, one each; the step's pace is what its costliest unit would cost with its
    rows filled by the cheapest work there is (tokens at the linear cost), and at least a full step of the costliest
    pieces' mean unit (else a step of costly documents only would leave half its rows empty). Then every unit takes
    the next pieces that fit its rows while its cost stays within the pace (the cheapest unit first): units of cheap
    documents fill their rows, and a costly document's unit does not take more than its share, so the units of a
    step cost alike as far as their rows allow. Documents sorted by cost over a window meet their like in the same
    steps.
    """
    rows: list[list[list[Piece]]] = [[[] for _ in range(per_unit)] for _ in range(units)]
    room = [[(seq_len, j) for j in range(per_unit)] for _ in range(units)]
    spent = [0.0] * units
    left: list[Piece] = []
    pace = float("inf")
    floor, tokens = 0.0, 0  # a full step of the costliest pieces left, per unit: the pace is at least that
    for piece in todo:
        if tokens >= step_tokens:
            break
        floor, tokens = floor + price(piece), tokens + piece[2] - piece[1]
    floor /= units
    for k, piece in enumerate(todo):
        size, paid = piece[2] - piece[1], price(piece)
        u = k if k < units else _unit(spent, room, size, paid, pace)
        if u < 0:
            left.append(piece)
            continue
        _place(rows[u], room[u], piece, size)
        spent[u] += paid
        if k == units - 1:  # the pace: the costliest unit, its rows filled with the cheapest work there is
            pace = max(floor, max(spent[v] + linear * sum(free for free, _ in room[v]) for v in range(units)))
            pace *= 1 + SLACK
    return rows, spent, left


def _place(rows: list[list[Piece]], room: list[tuple[int, int]], piece: Piece, size: int) -> None:
    """``piece`` into the fullest of a unit's ``rows`` that holds it; ``room``: (free slots, row), sorted."""
    at = bisect.bisect_left(room, (size, -1))
    free, j = room.pop(at)
    rows[j].append(piece)
    if free > size:
        bisect.insort(room, (free - size, j))


def _spread(todo: list[Piece], units: int, per_unit: int, seq_len: int, price: Callable[[Piece], float],
            ahead: bool) -> tuple[tuple[list[list[list[Piece]]], list[float]], list[Piece]]:
    """``todo`` (costliest first) over ``units`` units: the units, their costs, and what is left.

    Each piece goes to the cheapest unit so far with a row that holds it, into its fullest such row
    (longest-processing-time with rows).

    ``ahead``: "cheapest" counts a unit's empty room at the mean cost per token of the pieces still to place, so that
    a unit filled early with cheap tokens is not the last to take the costly pieces that fit nowhere else.
    """
    rows: list[list[list[Piece]]] = [[[] for _ in range(per_unit)] for _ in range(units)]
    room = [[(seq_len, j) for j in range(per_unit)] for _ in range(units)]
    spent = [0.0] * units
    left: list[Piece] = []
    empty = [per_unit * seq_len] * units
    cost_left, tokens_left = sum(price(p) for p in todo), sum(p[2] - p[1] for p in todo)
    for piece in todo:
        size, paid = piece[2] - piece[1], price(piece)
        rate = cost_left / tokens_left if ahead else 0.0  # what a token of the pieces still to place costs
        cost_left, tokens_left = cost_left - paid, tokens_left - size
        u = -1  # the unit that will cost least when its room is filled at that rate
        for v in range(units):
            if room[v] and room[v][-1][0] >= size and (u < 0 or spent[v] + rate * empty[v] <
                                                      spent[u] + rate * empty[u]):
                u = v
        if u < 0:
            left.append(piece)
            continue
        _place(rows[u], room[u], piece, size)
        spent[u] += paid
        empty[u] -= size
    return (rows, spent), left


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
