"""The reader of image-text shards (``"kind": "image_text"``, :mod:`stallfree.ingest.image_text_writer`).

A document is its text token ids, its encoded images, where each image goes in the text (``image_at``), and which
tokens are targets (``assistant``). :class:`ImageTextShardReader` opens as a token shard folder does: the manifest,
``lengths.npy`` and ``image_counts.npy`` now (checked), so the sampler knows every document's length and image
count before an epoch, and each shard memory-mapped and checked on its first read. Its ``read(i)`` gives
``{"tokens", "images", "image_at", "assistant"}``: the ids, each image's encoded bytes and the two per-token and
per-image arrays, all views into the shard's mapping (no copy).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.ingest.fields import ASSISTANT, IMAGE_AT, IMAGE_TEXT_FIELDS, IMAGES, TOKENS, Field
from stallfree.ingest.manifest import read_manifest
from stallfree.pipeline.reader_base import Sample
from stallfree.pipeline.shards import Verify, _Shard, column_views, is_shard_folder
from stallfree.pipeline.token_readers import TokenShardReader

__all__ = ["ImageTextKind", "ImageTextShardReader", "document_fields", "is_image_text_folder"]


def _image_views(column: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ``list<binary>`` column as (per row: its first and past-last image), (per image: its bytes' span), bytes."""
    outer = np.frombuffer(column.buffers()[1], np.int32)[column.offset : column.offset + len(column) + 1]
    offsets, data = column_views(column.values)
    return outer, offsets, data


def document_fields(shard: _Shard, row: int) -> dict[str, Any]:
    """Row ``row`` of a mapped image-text ``shard`` (its token ids are its payload): every field, views, no copy.

    The other columns' views are made on the shard's first such read and kept with its mapping.
    """
    views = getattr(shard, "image_text_views", None)
    if views is None:  # made twice at worst, by two threads at once: the same views
        views = [{IMAGES.name: _image_views(b.column(IMAGES.name)),
                  IMAGE_AT.name: column_views(b.column(IMAGE_AT.name)),
                  ASSISTANT.name: column_views(b.column(ASSISTANT.name))} for b in shard.batches]
        shard.image_text_views = views  # type: ignore[attr-defined]
    batch, i = shard.locate(row)
    outer, offsets, data = views[batch][IMAGES.name]
    at_offsets, at = views[batch][IMAGE_AT.name]
    mark_offsets, marks = views[batch][ASSISTANT.name]
    return {TOKENS.name: shard.image(row),
            IMAGES.name: [data[offsets[j] : offsets[j + 1]] for j in range(int(outer[i]), int(outer[i + 1]))],
            IMAGE_AT.name: at[at_offsets[i] : at_offsets[i + 1]],
            ASSISTANT.name: marks[mark_offsets[i] : mark_offsets[i + 1]]}


class ImageTextKind:
    """What the image-text readers (local and at a URL) answer alike: their fields, image counts and columns."""

    holds = "image_text"
    fields: Sequence[Field] = IMAGE_TEXT_FIELDS
    _counts: np.ndarray

    def image_counts(self) -> np.ndarray:
        """Every document's image count (int64), in row order, without opening a shard."""
        return self._counts

    def _image_count_column(self, rows: np.ndarray) -> np.ndarray:
        return np.array(self._counts[np.asarray(rows, np.int64)], np.int64)


class ImageTextShardReader(ImageTextKind, TokenShardReader):
    """Rows of an image-text shard folder: text ids, encoded images, ``image_at`` and ``assistant``, no copy.

    Opens as :class:`~stallfree.pipeline.token_readers.TokenShardReader` does, and reads ``image_counts.npy`` (checked
    against the manifest's SHA-256 unless ``verify="none"``) too. Its :attr:`columns` are the shards' ``length`` and
    ``source`` (``"FILE:ROW"`` of the input row) and the rest of the schema, and ``image_count``.

    Attributes:
        layout: the manifest's ``"caption"`` or ``"conversations"``.

    Raises:
        FileNotFoundError: no manifest.
        ValueError: the folder holds another kind (named, with the reader that opens it).
        ShardError: ``lengths.npy`` or ``image_counts.npy`` missing, truncated or altered.
    """

    def __init__(self, folder: str | os.PathLike[str], verify: Verify = "first-use"):
        super().__init__(folder, verify)
        self.layout = str(self.manifest.get("layout", "caption"))
        self.columns = [*self.columns, "image_count"]

    def _read_labels(self) -> np.ndarray:
        labels = super()._read_labels()
        self._counts = np.asarray(self._column_file(self.manifest["image_counts"]), np.int64)
        return labels

    def read(self, index: int) -> Sample:
        """Row ``index``: ``{"tokens", "images" (a list of encoded images), "image_at", "assistant"}``, no copy.

        Raises:
            ShardError: its shard is missing, damaged, or fails its checksum.
        """
        shard_index, row = self._locate(index)
        shard = self._shard(shard_index)
        if self._verify != "none":
            shard.check()
        return document_fields(shard, row)

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """Column ``name`` at ``rows``; ``length`` and ``image_count`` from their files, no shard opened."""
        return self._image_count_column(rows) if name == "image_count" else super().column(name, rows)


def is_image_text_folder(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an ingested folder of image-text shards (its manifest's ``kind`` is ``image_text``)."""
    return is_shard_folder(path) and read_manifest(Path(path).parent if Path(path).name == "manifest.json"
                                                   else path).get("kind") == "image_text"
