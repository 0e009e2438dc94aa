"""``bench packing``'s contenders: five ways to feed a language model the same token shards, each built as its users do.

- ``packed``: stallfree's Loader with ``packing=Packing(seq_len=S)``: ``[B, S]`` rows, best-fit decreasing over
  windows of 1,000 documents of the epoch's order, long documents split;
- ``padded``: stallfree's Loader without ``packing``: ``B_pad`` documents padded to the batch's longest;
- ``torch-pad``: torch's ``DataLoader`` over a map-style ``Dataset`` of the shards' documents (each an
  ``{"input_ids": list}``, as a ``datasets.Dataset`` gives it) with ``transformers``'
  ``DataCollatorForLanguageModeling(mlm=False)`` (it pads as ``DataCollatorWithPadding`` does, with the tokenizer's
  ``pad``, and adds the labels): ``B_pad`` documents per batch;
- ``torch-flat``: the same ``DataLoader`` with ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``: the
  ``B_pad`` documents concatenated into one row of varying length (padding-free);
- ``trl-bfd``: TRL's ``pack_dataset(ds, S, strategy="bfd")`` (best-fit decreasing over map batches of 1,000
  documents; a document longer than S is truncated, its overflow dropped) once before the loop, then what TRL's
  ``SFTTrainer`` feeds: a ``DataLoader`` of ``B`` packed rows with TRL's
  ``DataCollatorForLanguageModeling(padding_free=True)``, which concatenates them into one row.

``B_pad`` = round(B * S / the mix's mean length): a padded batch then holds, on average, as many real tokens as a
packed batch has slots. Every DataLoader shuffles and runs ``num_workers`` = ``--workers`` (default: the cores this
process may use), not persistent (the Hugging Face Trainer's default: each epoch starts its workers). No contender
truncates but TRL's ``bfd``. The padding id is 0, which no document holds. Nothing is downloaded: the padding
collator's tokenizer is built here, empty but for ``<pad>`` (padding needs no vocabulary).
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallfree.bench.packing_mixes import MixData

__all__ = ["CONTENDERS", "Feed", "feed", "padded_batch_size", "skip_reason"]

#: name: what the table calls it
CONTENDERS = {
    "packed": "stallfree packed",
    "padded": "stallfree padded",
    "torch-pad": "DataLoader + DataCollatorForLanguageModeling",
    "torch-flat": "DataLoader + DataCollatorWithFlattening",
    "trl-bfd": "TRL pack_dataset bfd + padding-free",
}


@dataclass(frozen=True)
class Feed:
    """A contender over one mix: a fresh epoch per ``epoch()``; ``count(batch)`` is its (real tokens, slots, shape).

    ``prep_s``: seconds spent before the loop (TRL's packing map); ``dropped``: tokens the feed never delivers
    (TRL's truncation), known before the loop; ``images``: an image-text feed's count of a batch's images.
    """

    epoch: Callable[[], Iterable[Any]]
    count: Callable[[Any], tuple[int, int, tuple[int, ...]]]
    prep_s: float = 0.0
    dropped: int = 0
    images: Callable[[Any], int] | None = None  # an image-text feed's images in a batch (one per document)
    note: str = ""  # how it works where that varies by machine (the image-text DataLoader's resize)


def padded_batch_size(batch_size: int, seq_len: int, mean_length: float) -> int:
    """Documents per padded batch: about as many real tokens as ``batch_size`` packed rows of ``seq_len`` slots."""
    return max(1, round(batch_size * seq_len / mean_length))


def skip_reason(name: str) -> str | None:
    """Why contender ``name`` cannot run here (a package missing), or None."""
    needs = {"torch-pad": ("transformers", "tokenizers"), "torch-flat": ("transformers",),
             "trl-bfd": ("trl", "datasets", "transformers")}.get(name, ())
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    extra = "pip install 'stallfree[bench]'" if name == "trl-bfd" else "pip install transformers tokenizers"
    return f"{', '.join(missing)} not importable ({extra})"


def _tensor_count(mask_key: str | None) -> Callable[[Any], tuple[int, int, tuple[int, ...]]]:
    def count(batch: Any) -> tuple[int, int, tuple[int, ...]]:
        ids = batch["input_ids"]
        if mask_key == "document_index":
            real = int((batch["document_index"] >= 0).sum())
        elif mask_key == "attention_mask":
            real = int(batch["attention_mask"].sum())
        else:  # flattened: every slot is a token
            real = ids.numel()
        return real, ids.numel(), tuple(ids.shape)

    return count


class ShardDocuments:
    """The documents of a token-shard folder as a map-style Dataset: ``{"input_ids": list of int}`` per row.

    A list, as a ``datasets.Dataset`` row gives it and as the collators take it. The reader goes to the workers as
    its folder (it pickles so).
    """

    def __init__(self, folder: Path):
        from stallfree.pipeline.token_readers import TokenShardReader

        self.folder, self._reader = folder, TokenShardReader(folder)

    def __len__(self) -> int:
        return len(self._reader)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return {"input_ids": self._reader.read_tokens(index).tolist()}


def _pad_tokenizer() -> Any:
    """A ``transformers`` tokenizer that knows only ``<pad>`` (id 0): what the padding collator needs."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0}, unk_token="<pad>")),
                                   pad_token="<pad>")


def _dataloader(dataset: Any, batch_size: int, workers: int, collate: Any, seed: int) -> Any:
    import torch

    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                       collate_fn=collate,
                                       generator=torch.Generator().manual_seed(seed))


def _trl(mix: MixData, args: argparse.Namespace) -> tuple[Any, float, int]:
    """TRL's bfd packs of the mix's documents, the seconds packing took, and the tokens its truncation dropped.

    The documents go in as a ``datasets.Dataset`` of ``input_ids`` (list<int32>, as ``datasets`` stores a
    tokenizer's output), built from the shards' rows.
    """
    import time

    import numpy as np
    import pyarrow as pa
    from datasets import (  # type: ignore[import-untyped]  # ships no stubs
        Dataset,
        disable_progress_bars,
        enable_progress_bars,
        is_progress_bar_enabled,
    )
    from trl import pack_dataset

    from stallfree.pipeline.token_readers import TokenShardReader

    reader = TokenShardReader(mix.folder)
    offsets = np.zeros(len(mix.lengths) + 1, np.int32)
    np.cumsum(mix.lengths, out=offsets[1:])
    ids = np.concatenate([reader.read_tokens(i) for i in range(len(reader))]).astype(np.int32)
    dataset = Dataset(pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))}))
    shown = is_progress_bar_enabled()
    if not args.progress:
        disable_progress_bars()  # the map's bar, which --no-progress hides as it hides ours
    try:
        start = time.perf_counter()
        packed = pack_dataset(dataset, args.seq_len, strategy="bfd")
        seconds = time.perf_counter() - start
    finally:
        if shown:
            enable_progress_bars()
    dropped = int(np.maximum(mix.lengths - args.seq_len, 0).sum())
    return packed, seconds, dropped


@contextmanager
def feed(name: str, mix: MixData, args: argparse.Namespace) -> Iterator[Feed]:
    """Contender ``name`` over ``mix`` under ``args`` (batch_size, seq_len, workers, seed); shut down on exit."""
    import stallfree

    batch = args.batch_size
    pad_batch = padded_batch_size(batch, args.seq_len, float(mix.lengths.mean()))
    if name in ("packed", "padded"):
        packing = stallfree.Packing(seq_len=args.seq_len) if name == "packed" else None
        loader = stallfree.Loader(mix.folder, batch if packing else pad_batch, packing=packing, shuffle=True,
                                  seed=args.seed)
        with loader:
            yield Feed(lambda: loader, _tensor_count("document_index" if packing else "attention_mask"))
        return
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithFlattening

    if name == "trl-bfd":
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling as TrlCollator

        packed, prep, dropped = _trl(mix, args)
        loader = _dataloader(packed, batch, args.workers, TrlCollator(pad_token_id=0, padding_free=True), args.seed)
        made = Feed(lambda: loader, _tensor_count(None), prep, dropped)
    elif name == "torch-pad":
        collate: Any = DataCollatorForLanguageModeling(_pad_tokenizer(), mlm=False)
        loader = _dataloader(ShardDocuments(mix.folder), pad_batch, args.workers, collate, args.seed)
        made = Feed(lambda: loader, _tensor_count("attention_mask"))
    elif name == "torch-flat":
        collate = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
        loader = _dataloader(ShardDocuments(mix.folder), pad_batch, args.workers, collate, args.seed)
        made = Feed(lambda: loader, _tensor_count(None))
    else:
        raise ValueError(f"no contender {name!r}; the contenders are {', '.join(CONTENDERS)}")
    yield made  # the workers end with each epoch's iterator (not persistent, as the Trainer's default)
