"""Packed token sequences: every document's tokens exactly once per epoch over the ranks, whole or split in order;
the same batch count on every rank; bit-identical and elastic resume; Hugging Face's label and position rules."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from stallfree import Loader, Packing
from stallfree.pipeline.packing import pack

S, B = 32, 3


@pytest.fixture
def lengths() -> np.ndarray:
    rng = np.random.default_rng(4)
    return np.concatenate([rng.integers(1, 30, 70), [S, 2 * S + 5, 77, 1]])  # one too long for a row, one split twice


def make(token_docs: Callable[..., Any], lengths: np.ndarray, **kwargs: Any) -> Loader:
    kwargs = {"packing": Packing(seq_len=S, window=16), "shuffle": True, "seed": 3, **kwargs}
    return Loader(token_docs(lengths), B, **kwargs)


def tokens_seen(batches: list[dict[str, torch.Tensor]]) -> Counter[tuple[int, int]]:
    """(document row, position in it) of every real token delivered."""
    seen: Counter[tuple[int, int]] = Counter()
    for b in batches:
        real = b["document_index"] >= 0
        for doc, pos in zip(b["document_index"][real].tolist(), b["position_ids"][real].tolist(), strict=True):
            seen[(doc, pos)] += 1
    return seen


def every_token(lengths: np.ndarray) -> Counter[tuple[int, int]]:
    return Counter((row, pos) for row, n in enumerate(lengths.tolist()) for pos in range(n))


def test_a_batch_follows_hugging_faces_conventions(token_docs: Callable[..., Any], lengths: np.ndarray) -> None:
    for b in make(token_docs, lengths):
        assert b["input_ids"].shape == b["labels"].shape == b["position_ids"].shape == (B, S)
        assert b["input_ids"].dtype == torch.int64 and b["cu_seqlens"].dtype == torch.int32
        ids, labels, pos, doc = b["input_ids"], b["labels"], b["position_ids"], b["document_index"]
        real = doc >= 0
        # a token's id names its document and position (TokenDocs: 1000 * row + position + 1)
        assert torch.equal(ids[real], doc[real] * 1000 + pos[real] + 1)
        assert (labels[~real] == -100).all() and (ids[~real] == 0).all()
        starts = torch.zeros_like(real)
        starts[:, 0] = True
        starts[:, 1:] = (doc[:, 1:] != doc[:, :-1]) | (pos[:, 1:] != pos[:, :-1] + 1)  # a new segment begins
        assert (labels[starts] == -100).all(), "a segment's first token is never a target"
        assert torch.equal(labels[real & ~starts], ids[real & ~starts])
        cu = b["cu_seqlens"].tolist()
        assert cu[0] == 0 and cu[-1] == B * S and len(cu) - 1 == int(starts.sum())
        assert b["max_seqlen"] == max(np.diff(cu))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_token_exactly_once_per_epoch_over_the_ranks(token_docs: Callable[..., Any], lengths: np.ndarray,
                                                            world: int) -> None:
    loaders = [make(token_docs, lengths, rank=r, world_size=world) for r in range(world)]
    for epoch in range(2):
        per_rank = [list(loader) for loader in loaders]
        assert len({len(p) for p in per_rank}) == 1, "every rank gets the same number of batches"
        assert tokens_seen([b for p in per_rank for b in p]) == every_token(lengths), f"epoch {epoch}"


def test_the_epochs_differ_and_the_plan_is_the_same_on_every_rank(token_docs: Callable[..., Any],
                                                                     lengths: np.ndarray) -> None:
    one = [b["document_index"].clone() for b in make(token_docs, lengths)]
    again = [b["document_index"].clone() for b in make(token_docs, lengths)]
    assert all(torch.equal(a, b) for a, b in zip(one, again, strict=True))
    loader = make(token_docs, lengths)
    list(loader)
    second = [b["document_index"] for b in loader]
    assert not all(torch.equal(a, b) for a, b in zip(one, second, strict=False))


@pytest.mark.parametrize("taken", [0, 1, 4])
def test_a_state_resumes_bit_identically_in_a_new_loader(token_docs: Callable[..., Any], lengths: np.ndarray,
                                                          taken: int) -> None:
    reference = list(make(token_docs, lengths, rank=1, world_size=2))
    loader = make(token_docs, lengths, rank=1, world_size=2)
    it = iter(loader)
    for _ in range(taken):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make(token_docs, lengths, rank=1, world_size=2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(reference) - taken
    for a, b in zip(rest, reference[taken:], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels", "position_ids", "cu_seqlens"))


def test_an_elastic_resume_delivers_exactly_the_tokens_not_yet_delivered(token_docs: Callable[..., Any],
                                                                          lengths: np.ndarray) -> None:
    before = [make(token_docs, lengths, rank=r, world_size=2) for r in range(2)]
    its = [iter(loader) for loader in before]
    delivered = [next(it) for it in its for _ in range(2)]
    state = before[0].state_dict()
    after = [make(token_docs, lengths, rank=r, world_size=3) for r in range(3)]
    for loader in after:
        loader.load_state_dict(state)
    rest = [b for loader in after for b in loader]
    assert tokens_seen(delivered) + tokens_seen(rest) == every_token(lengths)
    assert len({len(list(loader)) for loader in after}) == 1, "the next epoch: whole, the same count on every rank"


def test_packing_is_tight_and_documents_stay_whole_unless_split() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 700, 3000)
    order = rng.permutation(len(lengths))
    plan = pack(order, lengths, Packing(seq_len=1024), len(lengths))
    assert plan.tokens == lengths.sum()
    assert plan.tokens / (len(plan) * 1024) > 0.97
    pieces = Counter(plan.virtual.tolist())
    assert set(pieces) == set(range(len(lengths))) and max(pieces.values()) == 1, "no document under S is split"


def test_long_documents_split_truncate_or_refuse(token_docs: Callable[..., Any]) -> None:
    lengths = np.array([5, 3 * S + 7, 9])
    split = [b for b in make(token_docs, lengths)]
    assert tokens_seen(split) == every_token(lengths), "split: every token, positions going on piece to piece"
    with pytest.warns(UserWarning, match=r"long='truncate'\) left out 71 tokens of 1 document"):
        cut = list(make(token_docs, lengths, packing=Packing(seq_len=S, long="truncate")))
    assert tokens_seen(cut) == every_token(np.array([5, S, 9]))
    with pytest.raises(ValueError, match=rf"row 1 has {3 * S + 7} tokens, more than seq_len={S} .*long='split'"):
        list(make(token_docs, lengths, packing=Packing(seq_len=S, long="error")))


def test_padded_batches_are_the_baseline_of_a_padding_collator(token_docs: Callable[..., Any]) -> None:
    lengths = np.array([3, 7, 2, 5, 4])
    batches = list(Loader(token_docs(lengths), 2))
    assert [tuple(b["input_ids"].shape) for b in batches] == [(2, 7), (2, 5), (1, 4)]
    b = batches[0]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0], [1] * 7]
    assert b["labels"][0].tolist() == [1, 2, 3, -100, -100, -100, -100]
    assert b["document_index"].tolist() == [0, 1]


def test_options_of_images_are_refused_for_token_sequences(token_docs: Callable[..., Any]) -> None:
    from stallfree.transforms import CenterCrop

    with pytest.raises(ValueError, match=r"transform= apply to images, but .* gives token sequences"):
        Loader(token_docs([3, 4]), 2, transform=[CenterCrop(4)])
    with pytest.raises(TypeError, match=r"packing must be None or stallfree.Packing"):
        Loader(token_docs([3, 4]), 2, packing=128)
    with pytest.raises(ValueError, match=r"Packing seq_len must be an int >= 2"):
        Packing(seq_len=1)


def _documents(batches: list[dict[str, torch.Tensor]]) -> dict[int, list[int]]:
    """Each document's tokens as delivered, by row, in position order (pieces joined)."""
    got: dict[int, dict[int, int]] = {}
    for b in batches:
        real = b["document_index"] >= 0
        for doc, pos, tok in zip(b["document_index"][real].tolist(), b["position_ids"][real].tolist(),
                                 b["input_ids"][real].tolist(), strict=True):
            assert pos not in got.setdefault(doc, {}), f"row {doc} position {pos} delivered twice"
            got[doc][pos] = tok
    return {doc: [toks[p] for p in sorted(toks)] for doc, toks in got.items()}


def test_text_ingested_with_a_local_tokenizer_comes_out_packed_as_the_tokenizer_encoded_it(
        texts: list[str], bpe_tokenizer: Any, tmp_path: Any) -> None:
    from tokenizers import Tokenizer

    from stallfree.ingest.token_runner import ingest_tokens
    from stallfree.ingest.token_writer import TokenOptions

    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    ingest_tokens(tmp_path / "docs.jsonl", tmp_path / "tokens", TokenOptions(tokenizer=str(bpe_tokenizer),
                                                                          shard_mb=0.001))
    encoded = [Tokenizer.from_file(str(bpe_tokenizer)).encode(t).ids for t in texts]
    batches = [b for r in range(2) for b in Loader(tmp_path / "tokens", 2, packing=Packing(seq_len=64),
                                                   shuffle=True, rank=r, world_size=2)]
    assert _documents(batches) == dict(enumerate(encoded))


def test_ids_read_in_place_skip_a_bad_row_under_on_error_skip(tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [[5, 6, 7], [8, -1], [9, 10, 11, 12], [13]]
    pq.write_table(pa.table({"input_ids": ids}), tmp_path / "ids.parquet")
    with pytest.raises(ValueError, match=r"ids.parquet row 1"):
        Loader(tmp_path / "ids.parquet", 2, packing=Packing(seq_len=8))
    loader = Loader(tmp_path / "ids.parquet", 2, packing=Packing(seq_len=8), on_error="skip")
    got = _documents(list(loader))
    assert sorted(got.values()) == [[5, 6, 7], [9, 10, 11, 12], [13]]
    assert loader.reader.rejected == [{"path": "ids.parquet:1", "reason": "negative token id -1"}]
    assert loader.state_dict()["rejected"] == loader.reader.rejected, "what the reader left out is in the state"


def test_token_runs_still_running_are_stopped_and_joined_before_the_interpreter_exits(
        token_docs: Callable[..., Any], lengths: np.ndarray) -> None:
    """A script that ends without close() with a token run at work (the next epoch's, started ahead) aborted at exit
    in about one run in ten ("terminate called without an active exception", exit 134): the exit hook stops them."""
    from stallfree.pipeline import token_run

    loader = make(token_docs, lengths, prefetch=1)
    list(loader)  # the pass's end starts the next epoch's run ahead
    left_open = iter(make(token_docs, lengths, prefetch=1))
    next(left_open)
    runs = list(token_run._RUNNING)
    assert any(not run.stopped for run in runs)
    token_run._stop_running_token_runs()
    assert all(run.stopped and not run._thread.is_alive() for run in runs)
