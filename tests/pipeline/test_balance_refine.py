"""The compute balance's last evening of a step (issue 48, item 4 on an image-text mix): one-for-two exchanges of
documents between units whose rows are full, and micro-batch slots dealt like with like."""

from __future__ import annotations

import numpy as np
import pytest

from stallfree import Cost
from stallfree.pipeline.balance import balanced_packs
from stallfree.pipeline.balance_refine import deal_slots, refine

S, B = 1024, 8
COST = Cost(1.0, 1.0 / S, 128.0)  # attention as costly as the rest at S; an image twice its 64 tokens' linear work
IMAGE = 64  # tokens an image adds to its document's length


def image_text(seed: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """An image-text-like mix: short texts, most with an image, a few with many (their tokens in the length)."""
    rng = np.random.default_rng(seed)
    n = tokens // 100
    text = np.clip(np.rint(rng.lognormal(np.log(40), 0.8, n)), 2, 256).astype(np.int64)
    which = rng.random(n)
    images = np.select([which < 0.2, which < 0.8, which < 0.95], [0, 1, rng.integers(2, 5, n)],
                       rng.integers(8, 13, n)).astype(np.int64)
    lengths = text + IMAGE * images
    keep = int(np.searchsorted(np.cumsum(lengths), tokens)) + 1
    return lengths[:keep], images[:keep]


def epoch_time(lengths: np.ndarray, images: np.ndarray, world: int, microbatches: int, balance: str) -> float:
    """The epoch under ranks in lockstep: per step, the sum over micro-batch slots of the slowest rank's unit."""
    order = np.random.default_rng(1).permutation(len(lengths))
    packs, _ = balanced_packs(order, lengths, len(lengths), seq_len=S, batch_size=B, microbatches=microbatches,
                              world_size=world, cost=COST if balance == "compute" else Cost(1.0),
                              group=balance == "compute", images=images)
    per_step, per = world * B, B // microbatches
    steps = -(-len(packs) // per_step)
    units = np.zeros((steps, world, microbatches))
    for p, pack in enumerate(packs):  # pack p of a step is rank p % W's row p // W
        s, at = divmod(p, per_step)
        i, r = divmod(at, world)
        units[s, r, i // per] += sum(COST.document(e - b, int(images[v]) if b == 0 else 0) for v, b, e in pack)
    return float(units.max(axis=1).sum())


@pytest.mark.parametrize(("world", "microbatches"), [(4, 1), (2, 4)])
def test_compute_gains_nine_tenths_of_the_ideal_on_an_image_text_mix(world: int, microbatches: int) -> None:
    """Full rows leave few one-for-one swaps; one-for-two exchanges and like-with-like slots reach 90% of the
    ideal's gain over token balance (the issue's target), on data parallelism and on a pipeline's micro-batches."""
    gains = []
    for seed in range(3):
        lengths, images = image_text(seed, 400_000)
        ideal = sum(COST.document(int(n), int(k)) for n, k in zip(lengths, images, strict=True)) / world
        tokens = epoch_time(lengths, images, world, microbatches, "tokens")
        compute = epoch_time(lengths, images, world, microbatches, "compute")
        assert compute <= 1.05 * ideal
        gains.append((tokens - compute) / (tokens - ideal))
    assert min(gains) >= 0.9, gains


def test_refine_exchanges_one_document_for_two_when_no_swap_fits() -> None:
    """Two full rows: no move fits and no two documents are as long, but a long one for two of its length evens."""
    cost = Cost(1.0, 0.01)
    price = lambda p: cost.document(p[2] - p[1])  # noqa: E731
    rows = [[[(0, 0, 40), (1, 0, 40), (2, 0, 20)]], [[(3, 0, 20), (4, 0, 20), (5, 0, 30), (6, 0, 30)]]]
    spent = [sum(price(p) for p in unit[0]) for unit in rows]
    assert spent == pytest.approx([136.0, 126.0])
    refine(rows, spent, 100, price, 8, pairs=False)
    assert spent == pytest.approx([136.0, 126.0])  # nothing one for one
    refine(rows, spent, 100, price, 8)
    assert max(spent) < 136.0
    assert sum(spent) == pytest.approx(262.0)
    for unit, paid in zip(rows, spent, strict=True):
        assert sum(e - b for e, b in ((p[2], p[1]) for p in unit[0])) <= 100
        assert sum(price(p) for p in unit[0]) == pytest.approx(paid)
    assert sorted(p[0] for unit in rows for p in unit[0]) == [0, 1, 2, 3, 4, 5, 6]


def test_slots_are_dealt_like_with_like_and_each_rank_alike() -> None:
    """2 ranks x 4 micro-batches: each slot holds two neighbours in cost, and the ranks' sums are equal."""
    spent = [8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0]
    unit = deal_slots(spent, 2, 4)
    assert sorted(unit) == list(range(8))
    dealt = np.asarray([spent[u] for u in unit]).reshape(2, 4)  # [rank, micro-batch]
    assert dealt.max(axis=0).sum() == 8 + 6 + 4 + 2  # the least the slots can wait
    assert dealt.sum(axis=1).tolist() == [18.0, 18.0]
