"""Packs balanced by compute: each global step's ranks x micro-batches hold even cost, while every guarantee of
packing holds (every token once, equal batch counts, bit-identical and elastic resume)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from stallfree import Cost, Loader, Packing

S, B, M = 64, 4, 2
COST = Cost.attention(S)  # attention as costly as the rest at full length


@pytest.fixture(scope="module")
def skewed() -> np.ndarray:
    """A chat mix with a tail of long documents: most short, a few near a row or past it."""
    rng = np.random.default_rng(7)
    lengths = np.concatenate([rng.integers(2, 12, 600), rng.integers(40, 100, 12)])
    return lengths[rng.permutation(len(lengths))]


def loaders(token_docs: Callable[..., Any], lengths: np.ndarray, world: int, balance: str | None,
            **kwargs: Any) -> list[Loader]:
    packing = Packing(seq_len=S, balance=balance, cost=COST if balance == "compute" else None, microbatches=M)
    source = token_docs(lengths)
    return [Loader(source, B, packing=packing, shuffle=True, seed=1, rank=r, world_size=world, **kwargs)
            for r in range(world)]


def seen(batches: list[dict[str, torch.Tensor]]) -> Counter[tuple[int, int]]:
    out: Counter[tuple[int, int]] = Counter()
    for b in batches:
        real = b["document_index"] >= 0
        out.update(zip(b["document_index"][real].tolist(), b["position_ids"][real].tolist(), strict=True))
    return out


def every(lengths: np.ndarray) -> Counter[tuple[int, int]]:
    return Counter((row, pos) for row, n in enumerate(lengths.tolist()) for pos in range(n))


def unit_costs(batches: list[dict[str, torch.Tensor]]) -> list[float]:
    """Each micro-batch's cost, recomputed from what was delivered (its segments of real tokens)."""
    costs = []
    for b in batches:
        for m in range(M):
            rows = slice(m * B // M, (m + 1) * B // M)
            doc, pos = b["document_index"][rows].flatten(), b["position_ids"][rows].flatten()
            starts = (doc >= 0) & ((pos == 0) | torch.cat([torch.tensor([True]), doc[1:] != doc[:-1]]))
            pieces = []
            for i in torch.nonzero(starts).flatten().tolist():
                n = 1
                while i + n < len(doc) and doc[i + n] == doc[i] and pos[i + n] == pos[i] + n:
                    n += 1
                pieces.append(n)
            costs.append(COST.lengths(pieces))
    return costs


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("balance", ["tokens", "compute"])
def test_every_token_once_and_the_same_batches_on_every_rank(token_docs: Callable[..., Any], skewed: np.ndarray,
                                                              world: int, balance: str) -> None:
    ranks = loaders(token_docs, skewed, world, balance)
    per_rank = [list(loader) for loader in ranks]
    assert len({len(p) for p in per_rank}) == 1
    assert seen([b for p in per_rank for b in p]) == every(skewed)


def test_compute_balance_brings_the_slowest_micro_batch_near_the_ideal(token_docs: Callable[..., Any],
                                                                       skewed: np.ndarray) -> None:
    slowest, ideal = {}, {}
    for balance in (None, "tokens", "compute"):
        ranks = loaders(token_docs, skewed, 2, balance)
        steps = list(zip(*(list(loader) for loader in ranks), strict=True))
        costs = [[c for b in step for c in unit_costs([b])] for step in steps]
        slowest[balance] = sum(max(c) for c in costs)  # a step takes its slowest micro-batch's time
        ideal[balance] = sum(sum(c) for c in costs) / (2 * M)  # every unit as busy as the mean
    assert slowest["compute"] < 1.1 * ideal["compute"], (slowest, ideal)
    assert slowest["compute"] < slowest[None] and slowest["compute"] < slowest["tokens"], slowest


def test_the_plan_reports_each_steps_planned_cost_and_its_planning_time(token_docs: Callable[..., Any],
                                                                        skewed: np.ndarray) -> None:
    loader = loaders(token_docs, skewed, 2, "compute")[0]
    plan = loader.sampler.plan(0)
    assert plan.balance is not None and plan.balance.seconds > 0
    assert plan.balance.costs.shape[1] == 2 * M
    delivered = unit_costs(list(loader))
    planned = plan.balance.costs[:, :M].flatten()  # rank 0's micro-batches, step by step
    assert np.allclose(delivered, planned[: len(delivered)])


def test_a_balanced_epoch_resumes_bit_identically_and_elastically(token_docs: Callable[..., Any],
                                                                  skewed: np.ndarray) -> None:
    reference = list(loaders(token_docs, skewed, 2, "compute")[1])
    loader = loaders(token_docs, skewed, 2, "compute")[1]
    it = iter(loader)
    next(it), next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = loaders(token_docs, skewed, 2, "compute")[1]
    resumed.load_state_dict(state)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(resumed, reference[2:], strict=True))
    # elastic: 2 batches delivered on 2 ranks, the rest of the epoch on 3 (its packs planned for 2), then epoch 1
    two = loaders(token_docs, skewed, 2, "compute")
    its = [iter(x) for x in two]
    delivered = [next(i) for i in its for _ in range(2)]
    three = loaders(token_docs, skewed, 3, "compute")
    for x in three:
        x.load_state_dict(two[0].state_dict())
    rest = [b for x in three for b in x]
    assert seen(delivered) + seen(rest) == every(skewed)
    assert seen([b for x in three for b in x]) == every(skewed), "the next epoch: planned for 3, every token once"


def test_a_balance_is_refused_without_what_it_needs(token_docs: Callable[..., Any]) -> None:
    with pytest.raises(ValueError, match=r"Packing\(balance='compute'\) balances a cost: give cost="):
        Packing(seq_len=S, balance="compute")
    with pytest.raises(ValueError, match=r"batch_size=3 rows do not split into Packing\(microbatches=2\)"):
        Loader(token_docs([4, 5, 6]), 3, packing=Packing(seq_len=S, balance="tokens", microbatches=2))
