"""Token shards at a URL: the cache and read-ahead of image shards at a URL, with the token kind's fields.

``Loader("s3://bucket/tokens/", packing=...)`` reads ``manifest.json`` and ``lengths.npy`` from the URL on
construction (so the packing of an epoch is known before any shard arrives), then each shard whole into the cache as
a pass reaches its documents, checked against the manifest's SHA-256, as an image dataset's shards are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stallfree.ingest.manifest import MANIFEST, read_manifest
from stallfree.ingest.remote import Retry
from stallfree.pipeline.image_text_reader import ImageTextKind, document_fields
from stallfree.pipeline.reader_base import Sample
from stallfree.pipeline.remote_shards import RemoteShardReader
from stallfree.pipeline.token_readers import TokenKind

__all__ = ["RemoteImageTextShardReader", "RemoteTokenShardReader", "open_remote"]


class RemoteTokenShardReader(TokenKind, RemoteShardReader):
    """Rows of a token-shard dataset at a URL: ids as views into the cached, memory-mapped shards.

    Takes :class:`~stallfree.pipeline.remote_shards.RemoteShardReader`'s arguments. Its :attr:`columns` are
    ``length`` and ``source``, as :class:`~stallfree.pipeline.token_readers.TokenShardReader`'s.

    Attributes:
        vocab_size: the vocabulary's size the ingest checked ids against (None when it knew none).
        token_dtype: the shards' id type, ``uint16`` or ``int32``.
    """

    payload = "tokens"
    holds = "tokens"

    def __init__(self, url: str, **keywords: Any):
        super().__init__(url, **keywords)
        self.encoded = False  # RemoteShardReader's image default, for a manifest without an image entry
        self.vocab_size: int | None = self.manifest["vocab_size"]
        self.token_dtype = np.dtype(self.manifest["token_dtype"])

    def _read_labels(self, storage_options: dict[str, Any]) -> np.ndarray:
        # called by RemoteShardReader.__init__: the lengths file is this kind's column file (labels are zeros)
        self._lengths = np.asarray(self._column_file(self.manifest["lengths"]), np.int64)
        return self.labels()

    def __len__(self) -> int:
        return RemoteShardReader.__len__(self)

    def read_tokens(self, index: int) -> np.ndarray:
        """Row ``index``'s ids (uint16 or int32), its shard fetched first if it is not cached."""
        return self.read_image(index)

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """Column ``name`` (``length``, ``source``) at ``rows``; ``length`` from ``lengths.npy``, no shard fetched."""
        if name == "length":
            return np.array(self._lengths[np.asarray(rows, np.int64)], np.int64)
        return super().column(name, rows)


class RemoteImageTextShardReader(ImageTextKind, RemoteTokenShardReader):
    """Rows of an image-text shard dataset at a URL, as :class:`~.image_text_reader.ImageTextShardReader` reads them.

    ``image_counts.npy`` comes with ``lengths.npy`` on construction; each shard whole into the cache when a pass
    reaches it, as token shards do.
    """

    def __init__(self, url: str, **keywords: Any):
        super().__init__(url, **keywords)
        self.columns = [*self.columns, "image_count"]

    def _read_labels(self, storage_options: dict[str, Any]) -> np.ndarray:
        labels = super()._read_labels(storage_options)
        self._counts = np.asarray(self._column_file(self.manifest["image_counts"]), np.int64)
        return labels

    def read(self, index: int) -> Sample:
        """Row ``index``'s fields (``tokens``, ``images``, ``image_at``, ``assistant``), its shard fetched first."""
        shard, row = self._locate(index)
        sha256 = self._entries[shard]["sha256"]
        mapped = self._acquire(shard)
        try:
            return document_fields(mapped, row)  # views into the mapping: valid after an eviction unlinks the file
        finally:
            self.cache.release(sha256)
            self.read_ahead.advance()

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        """Column ``name`` at ``rows``; ``length`` and ``image_count`` from their files, no shard fetched."""
        return self._image_count_column(rows) if name == "image_count" else super().column(name, rows)


def open_remote(url: str, **keywords: Any) -> RemoteShardReader:
    """The reader of the dataset at ``url``, by its manifest's kind (read once): images, token or image-text shards.

    ``keywords``: :class:`~stallfree.pipeline.remote_shards.RemoteShardReader`'s.
    """
    base = (url[: -len(MANIFEST)] if url.endswith("/" + MANIFEST) else url).rstrip("/")
    manifest = read_manifest(base, keywords.get("storage_options"), keywords.get("retry") or Retry())
    kind = {"tokens": RemoteTokenShardReader, "image_text": RemoteImageTextShardReader}.get(
        manifest.get("kind", "images"), RemoteShardReader)
    return kind(url, manifest=manifest, **keywords)
