"""Mixtures of token sources: shares by weight over any window, deterministic per (seed, epoch), each source's
documents exactly once per pass of it over the ranks, bit-identical and elastic resume, each token's ``dataset``."""

from __future__ import annotations

import json
import re
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stallfree import Loader, Mix, Packing
from stallfree.ingest.fields import TOKEN_FIELDS
from stallfree.pipeline.mix import MixOrder, quotas
from stallfree.pipeline.reader_base import BaseReader

S, B = 32, 3
ROOT = Path(__file__).resolve().parents[2]


class Docs(BaseReader):
    """Source ``source``'s document ``i``: ``100000 * (source + 1) + 1000 * i + 1, ...`` (its tokens name both)."""

    fields = TOKEN_FIELDS
    encoded = False

    def __init__(self, lengths: np.ndarray, source: int):
        super().__init__()
        self.classes: list[str] = []
        self._lengths, self.source, self.name = np.asarray(lengths, np.int64), source, f"docs{source}"

    def __len__(self) -> int:
        return len(self._lengths)

    def labels(self) -> np.ndarray:
        return np.zeros(len(self), np.int64)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def read(self, index: int) -> dict[str, np.ndarray]:
        base = 100000 * (self.source + 1) + 1000 * index
        return {"tokens": np.arange(1, self._lengths[index] + 1, dtype=np.int32) + base}

    def describe(self, index: int) -> str:
        return f"docs{self.source} {index}"


def sources(*sizes: int) -> dict[str, Docs]:
    rng = np.random.default_rng(7)
    lengths = [rng.integers(1, 40, n) for n in sizes]
    lengths[0][:2] = [S, 2 * S + 3]  # a full row and one split over rows
    return {f"s{s}": Docs(lengths[s], s) for s in range(len(sizes))}


# a: 40 rows, 20 a epoch (a pass every 2 epochs); b: 10 rows, 25 an epoch (2.5 passes an epoch)
WEIGHTS = {"s0": 20, "s1": 25}


def make(mix: Mix | None = None, **kwargs: Any) -> Loader:
    mix = mix or Mix(sources(40, 10), weights=WEIGHTS, epoch_size=45)
    kwargs = {"packing": Packing(seq_len=S, window=8), "shuffle": True, "seed": 3, **kwargs}
    return Loader(mix, B, **kwargs)


def tokens_seen(batches: list[dict[str, torch.Tensor]]) -> Counter[tuple[int, int, int]]:
    """(source, document row in it, position) of every real token delivered."""
    seen: Counter[tuple[int, int, int]] = Counter()
    for b in batches:
        real = b["document_index"] >= 0
        keys = zip(b["dataset"][real].tolist(), b["document_index"][real].tolist(), b["position_ids"][real].tolist(),
                   strict=True)
        seen.update(keys)
    return seen


def every_token(mix: Mix, times: dict[str, int]) -> Counter[tuple[int, int, int]]:
    out: Counter[tuple[int, int, int]] = Counter()
    for s, (name, reader) in enumerate(mix.sources.items()):
        for row, n in enumerate(reader.lengths().tolist()):
            for pos in range(n):
                out[(s, row, pos)] = times[name]
    return Counter({k: v for k, v in out.items() if v})


def test_the_order_follows_the_stated_rule() -> None:
    # quotas by largest remainder, exactly; times (k + 1/2) / quota, ties to the earlier source
    assert quotas(10, [Fraction(1), Fraction(1), Fraction(1)]) == [4, 3, 3]
    assert quotas(7, [Fraction(0), Fraction(2), Fraction(5)]) == [0, 2, 5]
    order = MixOrder((5, 5), (3, 1), shuffle=False)
    assert order.sources(0).tolist() == [0, 0, 1, 0]
    # without shuffle each source reads its rows in order, going on from the last epoch's place; b starts pass 2
    assert [order.rows(order.virtual_order(e)).tolist() for e in range(3)] == [[0, 1, 5, 2], [3, 4, 6, 0],
                                                                              [1, 2, 7, 3]]


@pytest.mark.parametrize("weights", [(0.5, 0.3, 0.2), (1, 2, 3, 4, 5, 6, 7), (0.31, 0.17, 0.13, 0.11, 0.27, 0.01),
                                     (0.999, 0.001)])
def test_every_window_of_1000_holds_each_source_within_its_bound(weights: tuple[float, ...]) -> None:
    k = len(weights)
    sizes = [3000 + 500 * s for s in range(k)]
    mix = Mix({f"s{s}": Docs(np.ones(n, np.int64), s) for s, n in enumerate(sizes)},
              weights={f"s{s}": w for s, w in enumerate(weights)})
    loader = Loader(mix, 4, packing=Packing(seq_len=8), shuffle=True, seed=1)
    order = loader.sampler.documents
    assert isinstance(order, MixOrder)
    source = np.concatenate([order.dataset_of(order.rows(order.virtual_order(e))) for e in range(3)])
    length, share = order.epoch_size, np.asarray(weights) / sum(weights)
    for s in range(k):
        counts = np.concatenate([[0], np.cumsum(source == s)])
        window = counts[1000:] - counts[:-1000]  # every window of 1,000, across the epochs' boundaries too
        assert np.abs(window / 1000 - share[s]).max() <= 0.02, f"source {s} strays past 2 points"
        quota = order.quotas[s]
        bound = 1 + k * quota / length  # the documented bound, in samples, on quota / epoch_size's share
        assert np.abs(window - 1000 * quota / length).max() <= bound + 1e-9
        assert abs(quota - share[s] * length) < 1


def test_the_order_is_deterministic_per_seed_and_epoch() -> None:
    def ids(loader: Loader) -> list[torch.Tensor]:
        return [b["input_ids"] for b in loader]

    one, again, other = make(), make(), make(seed=4)
    first = ids(one)
    assert all(torch.equal(a, b) for a, b in zip(first, ids(again), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, ids(other), strict=False)), "another seed, another order"
    assert not all(torch.equal(a, b) for a, b in zip(first, ids(one), strict=False)), "the next epoch differs"


@pytest.mark.parametrize("world", [1, 2, 3])
def test_each_source_once_per_pass_of_it_over_the_ranks(world: int) -> None:
    loaders = [make(rank=r, world_size=world) for r in range(world)]
    per_rank = [[b for epoch in range(2) for b in loader] for loader in loaders]
    assert len({len(p) for p in per_rank}) == 1, "every rank gets the same number of batches"
    # two epochs: s0 (40 rows, 20 an epoch) one whole pass, s1 (10 rows, 25 an epoch) five passes
    mix = make().dataset
    assert tokens_seen([b for p in per_rank for b in p]) == every_token(mix, {"s0": 1, "s1": 5})


def test_each_token_names_its_source_and_packs_mix_sources() -> None:
    mixed = 0
    for b in make():
        ids, doc, pos, dataset = b["input_ids"], b["document_index"], b["position_ids"], b["dataset"]
        assert dataset.shape == (B, S) and dataset.dtype == torch.int64
        real = doc >= 0
        assert torch.equal(real, dataset >= 0), "dataset is -1 exactly on padding"
        # a token's id names its source, its document in that source, and its position (Docs)
        assert torch.equal(ids[real], 100000 * (dataset[real] + 1) + 1000 * doc[real] + pos[real] + 1)
        mixed += sum(len(set(row[row >= 0].tolist())) > 1 for row in dataset)
    assert mixed, "a pack holds documents of several sources"


@pytest.mark.parametrize("taken", range(5))
def test_a_state_resumes_bit_identically_across_epochs(taken: int) -> None:
    # at every batch of epoch 1 (of 5): the packing windows hold 8 documents of 45, so most states stand inside one,
    # with packs of two windows ahead; the sources' passes go on from where epoch 0 left them
    reference = make(rank=1, world_size=2)
    epochs = [list(reference) for _ in range(3)]
    assert len(epochs[1]) == 5
    loader = make(rank=1, world_size=2)
    list(loader)
    it = iter(loader)
    for _ in range(taken):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make(rank=1, world_size=2)
    resumed.load_state_dict(state)
    for want in (epochs[1][taken:], epochs[2]):
        got = list(resumed)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels", "position_ids", "cu_seqlens",
                                                          "document_index", "dataset"))


def test_an_elastic_resume_delivers_exactly_what_was_not_delivered() -> None:
    before = [make(rank=r, world_size=2) for r in range(2)]
    its = [iter(loader) for loader in before]
    delivered = [next(it) for it in its for _ in range(2)]
    state = before[0].state_dict()
    after = [make(rank=r, world_size=3) for r in range(3)]
    for loader in after:
        loader.load_state_dict(state)
    rest = [[b for b in loader] for loader in after]
    assert len({len(r) for r in rest}) == 1, "every new rank gets the same number of batches"
    whole = [b for r in range(1) for b in make(rank=r, world_size=1)]  # the epoch's tokens, on one rank
    assert tokens_seen(delivered) + tokens_seen([b for r in rest for b in r]) == tokens_seen(whole)


def test_padded_batches_resume_elastically() -> None:
    mix = Mix(sources(40, 10), weights={"s0": 1, "s1": 1}, epoch_size=48)

    def rows(batches: list[dict[str, torch.Tensor]]) -> Counter[tuple[int, int]]:
        return Counter((int(b["dataset"][r, 0]), int(b["document_index"][r])) for b in batches for r in range(len(b[
            "document_index"])))

    before = [make(mix, packing=None, rank=r, world_size=2) for r in range(2)]
    its = [iter(loader) for loader in before]
    delivered = [next(it) for it in its for _ in range(2)]
    state = json.loads(json.dumps(before[1].state_dict()))
    after = [make(mix, packing=None, rank=r, world_size=3) for r in range(3)]
    for loader in after:
        loader.load_state_dict(state)
    rest = [list(loader) for loader in after]
    assert len({len(r) for r in rest}) == 1
    assert rows(delivered) + rows([b for r in rest for b in r]) == rows(list(make(mix, packing=None)))


def test_a_mix_without_weights_reads_every_source_once_an_epoch() -> None:
    mix = Mix(sources(12, 30))
    loader = make(mix)
    for _ in range(2):
        assert tokens_seen(list(loader)) == every_token(mix, {"s0": 1, "s1": 1})


def test_bad_mixes_are_refused_naming_the_argument(image_folder: Path) -> None:
    docs = sources(4, 4)
    cases: list[tuple[Any, type[Exception], str]] = [
        (lambda: Mix({}), ValueError, "Mix sources is empty"),
        (lambda: Mix([docs["s0"]]), TypeError, "Mix sources must be a dict"),  # type: ignore[arg-type]
        (lambda: Mix(docs, weights={"s0": 1, "s1": 1, "x": 1}), ValueError, r"Mix weights name \['x'\]"),
        (lambda: Mix(docs, weights={"s0": 1}), ValueError, r"Mix weights lack \['s1'\]"),
        (lambda: Mix(docs, weights={"s0": -1, "s1": 2}), ValueError, r"Mix weights\['s0'\] must be a finite number"),
        (lambda: Mix(docs, weights={"s0": float("nan"), "s1": 2}), ValueError, r"weights\['s0'\] must be a finite"),
        (lambda: Mix(docs, weights={"s0": 0, "s1": 0.0}), ValueError, "Mix weights sum to zero"),
        (lambda: Mix(docs, weights={"s0": "1", "s1": 1}), TypeError, r"Mix weights\['s0'\] must be a number"),
        (lambda: Mix(docs, epoch_size=0), ValueError, "Mix epoch_size must be an int >= 1"),
        (lambda: Mix({"inner": Mix(docs)}), ValueError, r"Mix sources\['inner'\] is a Mix itself"),
        (lambda: make(Mix({"text": docs["s0"], "pictures": image_folder})), ValueError,
         "Mix source 'pictures' .* gives images, not token sequences"),
        (lambda: make(Mix({"text": docs["s0"], "none": Docs(np.zeros(0, np.int64), 1)}, {"text": 1, "none": 1})),
         ValueError,
         "Mix source 'none' is empty"),
        (lambda: make(Mix(docs), echo=2), ValueError, "echo=2 .* repeats documents"),
    ]
    for build, error, match in cases:
        with pytest.raises(error, match=match):
            build()
    make(Mix({**docs, "off": Docs(np.zeros(0, np.int64), 2)}, weights={"s0": 1, "s1": 1, "off": 0}))  # weight 0: fine


@pytest.mark.parametrize("world", [1, 2, 3])
def test_padded_batches_of_a_mix_name_each_tokens_source(world: int) -> None:
    # 24 + 24 documents an epoch (48: whole batches on 1, 2 and 3 ranks): over 5 epochs s0's 40 rows 3 times each,
    # s1's 10 rows 12 times each
    mix = Mix(sources(40, 10), weights={"s0": 1, "s1": 1}, epoch_size=48)
    loaders = [make(mix, packing=None, rank=r, world_size=world) for r in range(world)]
    seen: Counter[tuple[int, int]] = Counter()
    for loader in loaders:
        batches = [b for _ in range(5) for b in loader]
        assert len(batches) == 5 * -(-48 // world // B), "the same batches on every rank"
        for b in batches:
            ids, mask, dataset, doc = b["input_ids"], b["attention_mask"], b["dataset"], b["document_index"]
            assert dataset.shape == ids.shape and doc.shape == (len(ids),)
            assert torch.equal(dataset >= 0, mask == 1), "dataset is -1 exactly on padding"
            for r in range(len(ids)):
                source, n = int(dataset[r, 0]), int(mask[r].sum())
                assert (dataset[r, :n] == source).all()
                want = 100000 * (source + 1) + 1000 * int(doc[r]) + torch.arange(1, n + 1)
                assert torch.equal(ids[r, :n], want), "the row holds its source's document document_index"
                seen[(source, int(doc[r]))] += 1
    assert seen == Counter({**{(0, i): 3 for i in range(40)}, **{(1, i): 12 for i in range(10)}})


def test_a_state_of_another_mixture_is_refused() -> None:
    loader = make()
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(ValueError, match="source"):
        make(Mix(sources(40, 10), weights={"s0": 25, "s1": 20}, epoch_size=45)).load_state_dict(state)


def test_the_docs_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "docs" / "sequences.md").read_text()
    section = re.search(r"^## Mixtures.*?\n(.*?)^## ", text, re.S | re.M)
    assert section is not None, "docs/sequences.md has no '## Mixtures' section"
    example = section[1].split("An example that runs as it is", 1)
    assert len(example) == 2, "the section has no runnable example"
    blocks = re.findall(r"^```python\n(.*?)^```", example[1], re.S | re.M)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "docs/sequences.md", "exec"), {})  # noqa: S102 - the docs' own example, as written
    assert capsys.readouterr().out.strip() == "{'chat': 525, 'code': 225}"
