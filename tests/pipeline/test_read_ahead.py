"""ReadAhead: the thread looks again exactly when a read changes the wanted shards, not after every read."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stallfree.pipeline.read_ahead import ReadAhead, _index


def test_the_index_points_at_the_next_row_of_the_same_shard_and_each_shards_first() -> None:
    again, first = _index(np.array([3, 1, 3, 2, 1, 3]), 5)
    assert again.tolist() == [2, 4, 5, 6, 6, 6]
    assert first.tolist() == [6, 1, 3, 0, 6]  # shards 0 and 4 are not in the stream
    again, first = _index(np.empty(0, np.int64), 2)
    assert again.tolist() == [] and first.tolist() == [0, 0]


class _Cache:
    def protect(self, owner: int, wanted: set[str]) -> None:
        pass


def _stream(kind: str, shards: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Row indices in stream order: a global permutation, or blocks of 3 shards each shuffled within."""
    if kind == "global":
        return rng.permutation(shards * rows)
    blocks = [rng.permutation(np.arange(first * rows, min(first + 3, shards) * rows))
              for first in rng.permutation(np.arange(0, shards, 3))]
    return np.concatenate(blocks)


def _walk(kind: str, seed: int, budget: int | None) -> int:
    """Read a stream row by row, looking whenever advance() wakes the thread; assert that what was looked at last
    is what a look after every read would want. The number of looks."""
    rng = np.random.default_rng(seed)
    shards, rows = 12, 7
    entries: list[dict[str, Any]] = [{"sha256": f"{i:064x}", "bytes": int(rng.integers(50, 150))}
                                     for i in range(shards)]
    starts = np.arange(shards + 1) * rows
    budget = int(rng.integers(100, 700)) if budget is None else budget
    ahead = ReadAhead(_Cache(), entries, starts, budget, None, [str(i) for i in range(shards)])  # type: ignore[arg-type]
    ahead._closed = True  # no thread: the test looks when the thread would
    ahead.follow(_stream(kind, shards, rows, rng))

    def look() -> set[int]:
        wanted, _, until = ahead._look()
        ahead._until = until
        return set(wanted)

    def fresh() -> set[int]:  # the old look: the first distinct shards of the coming rows, within the budget
        coming = ahead._shards[ahead._position :]
        order = list(dict.fromkeys(coming.tolist()))
        chosen, total = [], 0
        for shard in order:
            if chosen and total + entries[shard]["bytes"] > budget:
                break
            chosen.append(shard)
            total += entries[shard]["bytes"]
        return set(chosen)

    held, looks = look(), 1
    for _ in range(shards * rows):
        ahead._wake.clear()
        ahead.advance()
        if ahead._wake.is_set():
            held, looks = look(), looks + 1
        assert fresh() == held  # what a look after this very read would want
    assert held == set()
    return looks


@pytest.mark.parametrize("kind", ["global", "block"])
@pytest.mark.parametrize("seed", range(6))
def test_the_wanted_shards_after_every_read_are_the_last_looks(kind: str, seed: int) -> None:
    _walk(kind, seed, budget=None)  # budgets from under one shard to several


@pytest.mark.parametrize("seed", range(3))
def test_a_look_per_shard_not_per_row(seed: int) -> None:
    rows = 12 * 7
    assert _walk("global", seed, budget=10**9) <= 12 + 1  # everything wanted: a look as each shard is done
    assert _walk("block", seed, budget=1000) < rows / 3  # two blocks' worth: a few looks a block
