"""A Mix opened: its sources' readers as one (:class:`MixReader`), and its batches' ``dataset`` field.

The Mix's rows are its sources' rows one after another, in the Mix's order (source ``s``'s row ``i`` is the Mix's row
``offsets[s] + i``); the order is :class:`~stallfree.pipeline.mix.MixOrder`'s and the packing plain packing's, so a
pack may hold documents of several sources. A batch says where each token comes from: ``dataset`` (the source's
position in the Mix, -1 on padding) and ``document_index`` (the row in *that source*, as a Loader over the source
alone numbers it) (:class:`MixBatches`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stallfree.ingest.fields import TOKEN_FIELDS, TOKENS
from stallfree.pipeline.mix import Mix, MixOrder
from stallfree.pipeline.reader_base import BaseReader, Sample
from stallfree.pipeline.token_run import Builder, TokenParts, TokenPlacement

if TYPE_CHECKING:
    from stallfree.pipeline.run_config import RunParts

__all__ = ["MixBatches", "MixPlacement", "MixReader", "open_mix"]


class MixReader(BaseReader):
    """The sources of a :class:`~stallfree.pipeline.mix.Mix`, opened, read as one token source.

    Args:
        mix: the Mix (its names, weights and epoch size).
        readers: each source's reader, by name, in the Mix's order.

    Raises:
        ValueError: a source that is not of the token-sequence kind (named, with its reader), or an empty source
            with a weight above zero.
    """

    fields = TOKEN_FIELDS
    encoded = False

    def __init__(self, mix: Mix, readers: Mapping[str, BaseReader]):
        super().__init__()
        self.classes: list[str] = []
        self.mix, self.readers = mix, dict(readers)
        for name, reader in self.readers.items():
            if not any(f.kind == TOKENS.kind for f in reader.fields) or not callable(getattr(reader, "lengths", None)):
                raise ValueError(f"Mix source {name!r} ({reader.kind}) gives images, not token sequences: a Mix "
                                 "mixes token-sequence sources (a token shard folder, a JSONL/Parquet file of "
                                 "input_ids, a datasets.Dataset; docs/sequences.md)")
        self.sizes = [len(reader) for reader in self.readers.values()]
        self.quotas = mix.quotas(self.sizes)
        for name, n, q in zip(self.readers, self.sizes, self.quotas, strict=True):
            if n == 0 and q > 0:
                raise ValueError(f"Mix source {name!r} is empty but has a share of the epoch: drop it or give it "
                                 "weight 0")
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.name = f"mix:{','.join(self.readers)}"

    def order(self, shuffle: bool, seed: int) -> MixOrder:
        """The Mix's documents in each epoch's order (:class:`MixOrder`)."""
        return MixOrder(tuple(self.sizes), tuple(self.quotas), shuffle=shuffle, seed=seed)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _local(self, index: int) -> tuple[int, BaseReader, int]:
        s = int(np.searchsorted(self.offsets[1:], index, side="right"))
        return s, list(self.readers.values())[s], index - int(self.offsets[s])

    def lengths(self) -> np.ndarray:
        """Every document's length, the sources' one after another (int64)."""
        parts = [np.asarray(getattr(r, "lengths")(), np.int64) for r in self.readers.values()]  # noqa: B009
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @property
    def has_images(self) -> bool:
        """Whether a source holds image-text documents (their images are decoded in the Loader's graph)."""
        return any(callable(getattr(r, "image_counts", None)) for r in self.readers.values())

    def image_counts(self) -> np.ndarray:
        """Every document's image count (int64; 0 for a text-only source's), the sources' one after another."""
        parts = [np.asarray(r.image_counts(), np.int64) if callable(getattr(r, "image_counts", None))  # type: ignore
                 else np.zeros(len(r), np.int64) for r in self.readers.values()]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def labels(self) -> np.ndarray:
        """Zeros, one per row: a token sample has no class (the Reader protocol asks)."""
        return np.broadcast_to(np.zeros(1, np.int64), (len(self),))

    def read(self, index: int) -> Sample:
        _, reader, local = self._local(int(index))
        return reader.read(local)

    def describe(self, index: int) -> str:
        s, reader, local = self._local(int(index))
        return f"Mix source {list(self.readers)[s]!r}: {reader.describe(local)}"

    def fingerprint(self) -> str:
        """The sources' own fingerprints, by name, and each one's quota of an epoch."""
        parts = [[name, str(r.fingerprint()), q] for (name, r), q in zip(self.readers.items(), self.quotas,
                                                                          strict=True)]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    def reopened(self) -> MixReader:
        """A fresh copy whose sources are reopened (a forked child's)."""
        return MixReader(self.mix, {name: r.reopened() for name, r in self.readers.items()})

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


def open_mix(mix: Mix, open_source: Callable[[Any], BaseReader]) -> MixReader:
    """The Mix's reader: each of its sources opened by ``open_source`` (the Loader's, with its options)."""
    return MixReader(mix, {name: open_source(each) for name, each in mix.sources.items()})


@dataclass(frozen=True, eq=False)
class MixBatches:
    """A batch with ``dataset`` [B, S] and ``document_index`` the row in each document's own source.

    ``dataset`` is each token's source (its position in the Mix), -1 on padding; packed batches and padded ones
    (``document_index`` [B], a document a row) alike.
    """

    build: Builder
    offsets: np.ndarray

    def __call__(self, ids: np.ndarray, epoch: int) -> tuple[np.ndarray, dict[str, Any]]:
        rows, fields = self.build(ids, epoch)
        documents = fields["document_index"]  # the Mix's rows: [B, S] packed, -1 on padding; [B] padded
        real = documents >= 0
        source = np.where(real, np.searchsorted(self.offsets[1:], documents, side="right"), -1)
        fields["document_index"] = np.where(real, documents - self.offsets[np.maximum(source, 0)], -1)
        if "attention_mask" in fields:  # padded batches: a document a row, its tokens where the mask is 1
            source = np.where(fields["attention_mask"] == 1, source[:, None], -1)
        fields["dataset"] = source
        if "image_document_index" in fields:  # an image's document: the row in its own source, as document_index
            images = fields["image_document_index"]
            owner = np.searchsorted(self.offsets[1:], images, side="right")
            fields["image_document_index"] = images - self.offsets[owner]
        return rows, fields

    def follow(self, ids: np.ndarray, epoch: int) -> None:
        self.build.follow(ids, epoch)


class MixPlacement(TokenPlacement):
    """The token runs of a Mix: batches with their ``dataset`` field (:class:`MixBatches`).

    Args:
        prefetch: batches a run makes ahead of the training loop.
        pad_id: the padding id of padded batches (packs carry their packing's).
        offsets: where each source's rows start in the Mix's.
    """

    def __init__(self, prefetch: int, pad_id: int, offsets: np.ndarray):
        super().__init__(prefetch, pad_id)
        self.offsets = offsets

    def _parts(self, parts: RunParts) -> TokenParts:
        made = super()._parts(parts)
        return dataclasses.replace(made, build=MixBatches(made.build, self.offsets))
