"""A keyed permutation of ``range(n)`` evaluated at any positions, without drawing the whole of it.

The sampler needs a global shuffle per ``(seed, epoch)`` but each rank reads only ``1 / world_size`` of it; drawing
the full permutation costs every rank O(n) time and memory (0.9 GB and 7 s at 100M samples). A keyed bijection
answers ``perm(p)`` for just the positions a rank owns.

It is a Feistel network over ``2**b >= n`` values (``b`` bits, the smallest power of two that holds ``n``), made
to stay inside ``range(n)`` by cycle-walking: a value that lands at or past ``n`` is encrypted again until it is
back in range. Cycle-walking a bijection of a superset gives a bijection of the subset (Black and Rogaway, 2002);
since ``2**b < 2n``, a value walks fewer than two steps on average. When ``b`` is odd the two halves differ by
one bit, and they swap sizes each round::

    round i:  value = X·2**ly + Y   (X: lx bits, Y: ly bits)
              value' = Y·2**lx + (X xor F(key_i, Y)) mod 2**lx      (now Y leads, with ly bits)

An even number of rounds brings the halves back to their sizes. ``F`` is SplitMix64's finaliser of ``Y`` mixed
with the round key; the round keys come from ``(seed, epoch)`` through SplitMix64 as well. Everything is NumPy
``uint64`` arithmetic on whole arrays (it wraps modulo 2**64, as the mixer wants).
"""

from __future__ import annotations

import numpy as np

from stallfree.core.mixer import GOLDEN, finalize, splitmix

__all__ = ["Permutation"]

_ROUNDS = 6  # even, so the halves end at their starting sizes; 4 already make a Feistel network a random-looking
# permutation (Luby-Rackoff), 6 leave a margin
_MASK64 = (1 << 64) - 1


_BLOCK = 1 << 15  # values encrypted at a time: the round's temporaries stay in the CPU's cache (2.4x faster)


def _mix(y: np.ndarray, key: np.uint64, out: np.ndarray) -> np.ndarray:
    """The round function into ``out``: SplitMix64's finaliser of ``y ^ key`` (uint64 in, uint64 out)."""
    np.bitwise_xor(y, key, out=out)
    out += np.uint64(GOLDEN)
    return finalize(out)


class Permutation:
    """A bijection of ``range(n)`` keyed by ``(seed, epoch)``; ``perm(positions)`` gives the values there.

    Args:
        n: the size of the domain (>= 1).
        seed: any int (taken modulo 2**64).
        epoch: any int >= 0.
    """

    def __init__(self, n: int, seed: int, epoch: int):
        if n < 1:
            raise ValueError(f"a permutation needs n >= 1, got n={n}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.n = int(n)
        self.bits = max(2, (self.n - 1).bit_length())
        state = splitmix((seed & _MASK64) ^ splitmix(epoch))
        keys = []
        for _ in range(_ROUNDS):
            state = splitmix(state)
            keys.append(state)
        self._keys = [np.uint64(k) for k in keys]

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        """One pass of the Feistel network over ``2**bits`` values (uint64 in, a new uint64 array out)."""
        out = values.copy()
        x, f = np.empty(min(_BLOCK, len(values)), np.uint64), np.empty(min(_BLOCK, len(values)), np.uint64)
        for lo in range(0, len(values), _BLOCK):
            v = out[lo : lo + _BLOCK]  # a view: rounds run in place
            xs, fs = x[: len(v)], f[: len(v)]
            lx, ly = self.bits // 2, self.bits - self.bits // 2
            for key in self._keys:
                np.right_shift(v, np.uint64(ly), out=xs)  # X, the leading lx bits
                v &= np.uint64((1 << ly) - 1)  # Y
                xs ^= _mix(v, key, fs)
                xs &= np.uint64((1 << lx) - 1)
                v <<= np.uint64(lx)
                v |= xs  # Y·2**lx + (X xor F(Y)) mod 2**lx
                lx, ly = ly, lx
        return out

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """``perm(p)`` for each position ``p`` in ``range(n)`` (int64 in, int64 out, same shape).

        Raises:
            ValueError: a position outside ``range(n)``.
        """
        positions = np.asarray(positions, np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.n):
            raise ValueError(f"positions must lie in range({self.n}), got [{positions.min()}, {positions.max()}]")
        out = self._encrypt(positions.astype(np.uint64))
        walking = np.flatnonzero(out >= np.uint64(self.n))
        while walking.size:  # cycle-walk: each lap leaves out the values that are back in range
            again = self._encrypt(out[walking])
            out[walking] = again
            walking = walking[again >= np.uint64(self.n)]
        return out.astype(np.int64)
