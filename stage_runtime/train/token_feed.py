"""What feeds a token model's stage 0: generated packed sequences (:class:`TokenBatches`), or the Loader's packs.

Both yield the Loader's packed batches (issue 46's contract): a dict of ``input_ids``, ``labels`` (-100 on padding
and on each document's first token), ``position_ids`` (from 0 at each document's start), ``document_index`` (-1 on
padding), each [B, S] int64, ``cu_seqlens`` (int32, the segments of the flattened batch: each document and each
row's padding run) and ``max_seqlen``. The job's task (:class:`~stallfree.stage_runtime.models.tasks.LanguageModeling`)
turns one into the trainer's batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.config.train_config import TrainConfig, Verify
from stallfree.stage_runtime.models.gpt import IGNORE_INDEX
from stallfree.stage_runtime.train.feed_state import checked_position, next_epoch

__all__ = ["GENERATED_VOCAB", "TokenBatches", "data_vocab", "packed_loader", "packing"]

GENERATED_VOCAB = 32  # the vocabulary of generated sequences when --vocab-size is not given
_MAX_STEP = 7  # a generated document's step is drawn from 1.._MAX_STEP


class TokenBatches:
    """A learnable generated corpus, packed: ``num_sequences`` rows of ``seq_len`` tokens, ``batch_size`` a batch.

    Row ``i`` is the same in every process and epoch (drawn from a generator keyed by ``(seed, i, split)``): documents
    of 4 to ``max(4, seq_len // 2)`` tokens, each an arithmetic sequence mod ``vocab_size`` of random start and step
    (from its third token on, each is fixed by the two before it, within its own document alone), filling the row
    (the last one drawn no longer than the space left); fewer than 4 tokens left are padding. Each epoch delivers
    every row once, in an order drawn from ``(seed, epoch)`` when ``shuffle``; ``rank``/``world_size`` shard the
    batches as the Loader does, and batches are full (the rows of an incomplete last batch are left out). A document
    is never split across rows here (the Loader's packing splits long ones; the model's tests cover split pieces).
    """

    def __init__(self, num_sequences: int, batch_size: int, seq_len: int, vocab_size: int, *, seed: int = 0,
                 rank: int = 0, world_size: int = 1, shuffle: bool = True, split: int = 0):
        if num_sequences < batch_size * world_size:
            raise ValueError(f"need at least one batch per replica: num_sequences={num_sequences}, "
                             f"batch_size={batch_size}, replicas={world_size}")
        if seq_len < 4 or vocab_size < 2:
            raise ValueError(f"generated token batches need seq_len >= 4 and vocab_size >= 2, got seq_len={seq_len}, "
                             f"vocab_size={vocab_size}")
        self.num_sequences, self.batch_size, self.seq_len, self.vocab_size = (num_sequences, batch_size, seq_len,
                                                                              vocab_size)
        self.seed, self.rank, self.world_size, self.shuffle, self.split = seed, rank, world_size, shuffle, split
        self.epoch, self._position, self._loaded = 0, 0, False

    @property
    def classes(self) -> list[str]:
        """No classes: a token sample has none (the Feed protocol asks)."""
        return []

    def __len__(self) -> int:
        return self.num_sequences // (self.batch_size * self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order next, from its first batch (from the loaded batch if a state of it is loaded)."""
        self.epoch, self._position = next_epoch(self.epoch, self._position, self._loaded, epoch)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order and the tokens."""
        return {"kind": "TokenBatches", "num_sequences": self.num_sequences, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "vocab_size": self.vocab_size, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "shuffle": self.shuffle, "split": self.split}

    def state_dict(self) -> dict[str, Any]:
        """Epoch and batches delivered in it (JSON-able), with the fingerprint."""
        return {"epoch": self.epoch, "batches": self._position, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the last batch delivered when ``state`` was taken.

        Raises:
            ValueError: another fingerprint, or a field missing, of another type or out of range (named).
        """
        self.epoch, self._position = checked_position("TokenBatches", state, self.fingerprint(), len(self))
        self._loaded = True

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._loaded = False
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = (torch.randperm(self.num_sequences, generator=g) if self.shuffle
                 else torch.arange(self.num_sequences))
        for b in range(self._position, len(self)):
            first = (b * self.world_size + self.rank) * self.batch_size
            rows = [self._row(int(i)) for i in order[first:first + self.batch_size]]
            self._position = b + 1
            yield self._make_batch(rows)
        self.epoch, self._position = self.epoch + 1, 0

    def _make_batch(self, rows: list[Any]) -> dict[str, Any]:
        """The packed batch of ``rows`` (each :meth:`_row`'s)."""
        return _batch(rows, self.seq_len)

    def _row(self, index: int) -> Any:
        """Row ``index``'s documents: (document index, tokens), in order."""
        g = torch.Generator().manual_seed((self.seed * 7_777_777 + index) * 2 + self.split)
        longest, at, docs = max(4, self.seq_len // 2), 0, []
        while self.seq_len - at >= 4:
            n = min(int(torch.randint(4, longest + 1, (1,), generator=g)), self.seq_len - at)
            start = int(torch.randint(self.vocab_size, (1,), generator=g))
            step = int(torch.randint(1, min(_MAX_STEP, self.vocab_size - 1) + 1, (1,), generator=g))
            docs.append((index * self.seq_len + at, (start + step * torch.arange(n)) % self.vocab_size))
            at += n
        return docs


def _batch(rows: list[list[tuple[int, torch.Tensor]]], seq_len: int) -> dict[str, Any]:
    """The contract's packed batch of ``rows`` (padding id 0; its positions 0, 1, ... from the run's start)."""
    shape = (len(rows), seq_len)
    ids, positions = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
    labels, documents = torch.full(shape, IGNORE_INDEX, dtype=torch.int64), torch.full(shape, -1, dtype=torch.int64)
    segments = [0]
    for r, docs in enumerate(rows):
        at = 0
        for doc, tokens in docs:
            n = len(tokens)
            ids[r, at:at + n], labels[r, at + 1:at + n] = tokens, tokens[1:]
            positions[r, at:at + n], documents[r, at:at + n] = torch.arange(n), doc
            at += n
            segments.append(segments[-1] + n)
        if at < seq_len:
            positions[r, at:] = torch.arange(seq_len - at)
            segments.append(segments[-1] + seq_len - at)
    lengths = [b - a for a, b in zip(segments, segments[1:], strict=False)]
    return {"input_ids": ids, "labels": labels, "position_ids": positions, "document_index": documents,
            "cu_seqlens": torch.tensor(segments, dtype=torch.int32), "max_seqlen": max(lengths)}


def packing(config: TrainConfig, train: bool = True) -> Any:
    """The Loader's ``Packing`` of a token job: rows of its packed length, balanced as ``--balance-batches`` says.

    A balance (training only) evens each step's packs over the ``--dp`` replicas x ``--microbatches`` micro-batches,
    by tokens or by the model's cost (``--attention-span``); a batch's rows are then in micro-batch order, as the
    trainer splits it.

    Raises:
        ValueError: a balance asked of a build whose ``Packing`` has none, naming the flag.
    """
    from stallfree.pipeline.packing import Packing  # DALI is an extra: --synthetic trains without it

    m, balance = config.model, config.feed.balance_batches
    if balance == "none" or not train:
        return Packing(seq_len=m.packed_len)
    if "balance" not in {f.name for f in dataclasses.fields(Packing)}:
        raise ValueError(f"--balance-batches {balance} needs stallfree.Packing(balance=...), which this build of "
                         "stallfree lacks; drop --balance-batches (or use --balance-batches none)")
    balanced: dict[str, Any] = {"balance": balance, "cost": m.cost, "microbatches": config.pipeline.microbatches}
    return Packing(seq_len=m.packed_len, **balanced)


def packed_loader(data: str, packs: Any, *, train: bool, batch_size: int, seed: int, replica: int, replicas: int,
                  device: str, clock: StageClock | None, workers: int | None, verify: Verify,
                  transform: Any = None) -> Any:
    """The Loader over the token source ``data``, its rows packed as ``packs`` says (:func:`packing`): a replica's feed.

    Training: shuffled, full batches (``drop_last``), started (its first packs are made while the stages build);
    evaluation: in order, the last batch kept. ``transform``: an image-text source's images' (``None``: no images).
    """
    from stallfree.pipeline.loader import Loader  # DALI is an extra: --synthetic trains without it

    images: dict[str, Any] = {} if transform is None else {"transform": transform}
    made = Loader(data, batch_size, packing=packs, shuffle=train, seed=seed, drop_last=train, rank=replica,
                  world_size=replicas, device=device, clock=clock, num_threads=workers, verify=verify, **images)
    return made.start() if train else made


def data_vocab(data: str) -> int:
    """The vocabulary of the token source ``data``, as its reader knows it (a token shard's manifest, ...).

    Raises:
        ValueError: the source does not know it; the message asks for ``--vocab-size``.
    """
    from stallfree.pipeline.readers import open_source  # DALI is an extra: --synthetic trains without it

    vocab = getattr(open_source(data), "vocab_size", None)  # token readers have it (issue 46's contract)
    if not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"training data {data}: its vocabulary size is not known ({vocab!r}); give --vocab-size V "
                         "(one more than the largest token id)")
    return vocab
