"""Evening a balanced step's units further: exchanges of documents between its costliest unit and a cheaper one.

A step made by :mod:`.balance` fills its rows (a step holds about as many tokens as it has slots), so a unit rarely
has room to take one more document, and a swap of two documents must keep both rows within ``seq_len``: the two
documents must be about as long. Under a cost with an image or an attention term, documents of like length can
still differ in cost, but the swaps that fit may not move the cost the gap needs. So :func:`refine` tries, from the
costliest unit to each cheaper one (the cheapest first)::

    1 for 0 or 1:  a document moves, or swaps with one (the cost moved nearest half their gap)
    1 for 2:       a document swaps with two of one row of the cheaper unit, or two of one row with one
                   (a long document for two shorter ones of its length moves the difference of their squares:
                   the fine steps a full row allows)

while the costliest unit's cost is more than ``EVEN`` above the cheaper one's. Each exchange keeps every row within
``seq_len`` and moves a cost in (0, gap): the costliest unit's cost only falls, and the cheaper one stays below it.
Everything here is a deterministic function of the step (ties to the first row and piece), so every rank refines
alike.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Iterator

import numpy as np

__all__ = ["EVEN", "TRIES", "deal_slots", "refine"]

#: Swaps tried per piece of the costliest unit, nearest the best first, when evening a step's units (_swap).
TRIES = 32
#: Units within this share of the costliest one's cost are even enough (refine stops).
EVEN = 0.001

Piece = tuple[int, int, int]  # (virtual id, begin, end)
Rows = list[list[Piece]]
#: An exchange: (cost moved, row in the costly unit, its pieces that go, row in the cheap unit, its pieces that go)
Exchange = tuple[float, int, tuple[int, ...], int, tuple[int, ...]]


def refine(rows: list[Rows], spent: list[float], seq_len: int, price: Callable[[Piece], float], rounds: int,
           pairs: bool = True) -> None:
    """Even a step's units (``rows[u]``, costing ``spent[u]``), in place, by up to ``rounds`` exchanges.

    Each round takes the costliest unit and the cheapest unit it has an exchange with (a move or a one-for-one
    swap; with ``pairs``, else one for two), the exchange whose cost moved is nearest half their gap.
    """
    units = len(spent)
    for _ in range(rounds):
        s = max(range(units), key=spent.__getitem__)
        best: Exchange | None = None
        f = -1
        for how in (_swap, _pair_swap) if pairs else (_swap,):
            for f in sorted(range(units), key=spent.__getitem__):
                gap = spent[s] - spent[f]
                if gap <= EVEN * spent[s]:
                    break
                best = how(rows[s], rows[f], gap, seq_len, price)
                if best is not None:
                    break
            if best is not None:
                break
        if best is None:
            return
        moved, js, gone, jf, back = best
        taken = [rows[s][js].pop(i) for i in sorted(gone, reverse=True)]
        given = [rows[f][jf].pop(i) for i in sorted(back, reverse=True)]
        rows[s][js].extend(reversed(given))
        rows[f][jf].extend(reversed(taken))
        spent[s] -= moved
        spent[f] += moved


def deal_slots(spent: list[float], world_size: int, microbatches: int) -> list[int]:
    """Which of a step's units goes to each (rank, micro-batch): ``unit[r * M + m]``.

    Ranks run micro-batch ``m`` together, so slot ``m`` lasts as long as its costliest unit: the units are dealt
    costliest first, ``world_size`` to a slot (like with like), and the ranks take them in snake order (the first
    rank the dearest of even slots, the last rank of odd ones) so that each rank's step costs alike too.
    """
    ranked = sorted(range(len(spent)), key=lambda u: (-spent[u], u))
    unit = [0] * len(spent)
    for m in range(microbatches):
        slot = ranked[m * world_size : (m + 1) * world_size]
        for k, u in enumerate(slot if m % 2 == 0 else slot[::-1]):
            unit[k * microbatches + m] = u
    return unit


def _swap(costly: Rows, cheap: Rows, gap: float, seq_len: int, price: Callable[[Piece], float]) -> Exchange | None:
    """The move or one-for-one swap from ``costly`` to ``cheap`` whose cost moved is in (0, gap) and nearest gap/2."""
    free_s = [seq_len - sum(p[2] - p[1] for p in row) for row in costly]
    free_f = [seq_len - sum(p[2] - p[1] for p in row) for row in cheap]
    theirs = sorted((price(b), jf, ib) for jf, row in enumerate(cheap) for ib, b in enumerate(row))
    prices = [t[0] for t in theirs]
    best: Exchange | None = None
    for js, row in enumerate(costly):
        for ia, a in enumerate(row):
            pa, la = price(a), a[2] - a[1]
            if pa < gap and (best is None or abs(pa - gap / 2) < abs(best[0] - gap / 2)):  # a move
                jf = next((j for j, free in enumerate(free_f) if free >= la), -1)
                if jf >= 0:
                    best = (pa, js, (ia,), jf, ())
            lo, hi = bisect.bisect_right(prices, pa - gap), bisect.bisect_left(prices, pa)
            mid = bisect.bisect_left(prices, pa - gap / 2, lo, hi)
            # outward from the swap that moves gap/2, while nearer than the best so far
            far = functools.partial(_distance, prices, pa - gap / 2)
            for k in itertools.islice(_outward(mid, lo, hi, far, abs(best[0] - gap / 2) if best else float("inf")),
                                      TRIES):
                pb, jf, ib = theirs[k]
                lb = cheap[jf][ib][2] - cheap[jf][ib][1]
                if free_f[jf] + lb >= la and free_s[js] + la >= lb:
                    best = (pa - pb, js, (ia,), jf, (ib,))
                    break
    return best


def _pair_swap(costly: Rows, cheap: Rows, gap: float, seq_len: int,
               price: Callable[[Piece], float]) -> Exchange | None:
    """The one-for-two swap (either way) whose cost moved is in (0, gap) and nearest gap/2; rows kept in room."""
    one_s, two_s = _singles(costly, seq_len, price), _doubles(costly, seq_len, price)
    one_f, two_f = _singles(cheap, seq_len, price), _doubles(cheap, seq_len, price)
    best: Exchange | None = None
    for give, take in ((one_s, two_f), (two_s, one_f)):
        if not len(give) or not len(take):
            continue
        # give[i] = (row, first, second, tokens, cost, free) of the unit it leaves; take[k] likewise
        moved = give[:, None, 4] - take[None, :, 4]
        fits = ((take[None, :, 5] + take[None, :, 3] >= give[:, None, 3]) &
                (give[:, None, 5] + give[:, None, 3] >= take[None, :, 3]) & (moved > 0) & (moved < gap))
        if not fits.any():
            continue
        miss = np.where(fits, np.abs(moved - gap / 2), np.inf)
        at = int(np.argmin(miss))  # the first of the nearest, row-major: deterministic
        i, k = divmod(at, miss.shape[1])
        if best is not None and miss.flat[at] >= abs(best[0] - gap / 2):
            continue
        g, t = give[i], take[k]
        mine = tuple(int(x) for x in g[1:3] if x >= 0)
        theirs = tuple(int(x) for x in t[1:3] if x >= 0)
        best = (float(moved[i, k]), int(g[0]), mine, int(t[0]), theirs)
    return best


def _singles(rows: Rows, seq_len: int, price: Callable[[Piece], float]) -> np.ndarray:
    """Each piece of ``rows`` as (row, index, -1, tokens, cost, its row's free slots)."""
    out: list[tuple[float, ...]] = []
    for j, row in enumerate(rows):
        free = seq_len - sum(p[2] - p[1] for p in row)
        out.extend((j, i, -1, p[2] - p[1], price(p), free) for i, p in enumerate(row))
    return np.asarray(out, np.float64).reshape(-1, 6)


def _doubles(rows: Rows, seq_len: int, price: Callable[[Piece], float]) -> np.ndarray:
    """Each two pieces of one row of ``rows`` as (row, index, index, tokens, cost, the row's free slots)."""
    out: list[tuple[float, ...]] = []
    for j, row in enumerate(rows):
        free = seq_len - sum(p[2] - p[1] for p in row)
        sizes, costs = [p[2] - p[1] for p in row], [price(p) for p in row]
        out.extend((j, a, b, sizes[a] + sizes[b], costs[a] + costs[b], free)
                   for a, b in itertools.combinations(range(len(row)), 2))
    return np.asarray(out, np.float64).reshape(-1, 6)


def _distance(prices: list[float], target: float, k: int) -> float:
    return abs(target - prices[k])


def _outward(mid: int, lo: int, hi: int, far: Callable[[int], float], within: float) -> Iterator[int]:
    """Indices of ``[lo, hi)``, nearest ``mid`` first by ``far`` (which grows away from it), while below ``within``."""
    left, right = mid - 1, mid
    a = far(left) if left >= lo else float("inf")
    b = far(right) if right < hi else float("inf")
    while min(a, b) < within:
        if a <= b:
            yield left
            left -= 1
            a = far(left) if left >= lo else float("inf")
        else:
            yield right
            right += 1
            b = far(right) if right < hi else float("inf")
