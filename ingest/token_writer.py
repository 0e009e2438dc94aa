"""Writing token shards: the options that decide their bytes, one Arrow file per shard, and ``lengths.npy``.

A token shard is an uncompressed Arrow IPC file, as an image shard is (:mod:`~stallfree.ingest.writer`), of these
columns::

    tokens  list<uint16> or list<int32>   a document's token ids (uint16 when every id is below 65,536)
    length  int32                         its number of tokens
    source  string                        where it came from: "FILE:ROW" (rows count from 0; see text_sources)

It is written under a temporary name and renamed when complete, then its record goes to ``.ingest/`` the same way,
holding, besides an image shard's rows, size and SHA-256, the tokens it holds and where in the source the next shard
starts (``"end": [file, row]``), from which a rerun after a kill goes on. ``lengths.npy`` (int32, one per document in
row order) is written from the shards' ``length`` columns before the manifest, as ``labels.npy`` is for images, so a
reader knows every length without opening a shard.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from stallfree.core.atomic import atomic_path, atomic_write
from stallfree.ingest.labels import save_labels
from stallfree.ingest.manifest import file_sha256
from stallfree.ingest.writer import BATCH_ROWS, record_path

__all__ = ["LENGTHS", "TokenOptions", "token_schema", "write_lengths", "write_record", "write_token_shard"]

#: Every document's length, beside the manifest (listed under its ``"lengths"``).
LENGTHS = "lengths.npy"


@dataclass(frozen=True)
class TokenOptions:
    """What a token ingest reads and how it writes it (all of it but ``on_error`` decides the shards' bytes).

    Args:
        text_field: the column of text to tokenize (default ``text`` when a ``tokenizer`` is given).
        tokens_field: the column of token ids (default ``input_ids``, else ``tokens``, when no tokenizer is given).
        tokenizer: a local ``tokenizer.json`` or ``transformers`` tokenizer folder (:mod:`.tokenizer`).
        special_tokens: add the tokenizer's own special tokens, as ``tokenizer.encode(text)`` does.
        add_bos: a token put at each document's start unless already there ("" : the ``transformers`` tokenizer's
            BOS token).
        add_eos: a token put at each document's end unless already there ("" : its EOS token).
        vocab_size: every id must be below it (default: the tokenizer's vocabulary, else unchecked and the shard's
            token type decided by the largest id).
        shard_mb: target shard size in MB (10**6 bytes) of token ids.
        on_error: a bad row (not text, empty, an id out of range, a missing field) raises ``ValueError`` naming the
            file and row (``"raise"``) or is left out and listed in ``rejected.jsonl`` (``"skip"``).
    """

    text_field: str | None = None
    tokens_field: str | None = None
    tokenizer: str | None = None
    special_tokens: bool = True
    add_bos: str | None = None
    add_eos: str | None = None
    vocab_size: int | None = None
    shard_mb: float = 256.0
    on_error: Literal["raise", "skip"] = "skip"

    def __post_init__(self) -> None:
        if not self.shard_mb > 0:
            raise ValueError(f"--shard-size must be positive MB, got {self.shard_mb}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"--vocab-size must be >= 1, got {self.vocab_size}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"--on-error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.tokenizer is None and (self.add_bos is not None or self.add_eos is not None):
            raise ValueError("--add-bos and --add-eos name tokens of the --tokenizer: pass --tokenizer PATH too")
        if self.tokenizer is None and not self.special_tokens:
            raise ValueError("--no-special-tokens applies to a --tokenizer's special tokens; there is no tokenizer")

    def to_json(self) -> dict[str, Any]:
        """The options as JSON values."""
        return asdict(self)


def token_schema(dtype: np.dtype[Any]) -> Any:
    """The Arrow schema of a token shard whose ids are ``dtype`` (uint16 or int32)."""
    import pyarrow as pa

    return pa.schema([pa.field("tokens", pa.list_(pa.from_numpy_dtype(dtype))), pa.field("length", pa.int32()),
                      pa.field("source", pa.string())], metadata={"stallfree": "1", "kind": "tokens"})


def write_token_shard(out: Path, name: str, documents: list[np.ndarray], sources: list[str], dtype: np.dtype[Any],
                      rejected: list[dict[str, str]], end: tuple[int, int]) -> dict[str, Any]:
    """Write the shard file ``name`` of ``documents`` (checked ids, in order) into ``out``, then its record.

    The record is ``{"file", "rows", "bytes", "sha256", "tokens", "rejected": [{"path", "reason"}], "end"}``; ``end``
    is ``(file, row)``, where the next shard's rows start.
    """
    import pyarrow as pa
    import pyarrow.ipc as ipc

    schema = token_schema(dtype)
    lengths = np.fromiter((len(d) for d in documents), np.int64, len(documents))
    path = out / name
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema) as writer:
        for start in range(0, max(len(documents), 1), BATCH_ROWS):
            part = documents[start : start + BATCH_ROWS]
            sizes = lengths[start : start + BATCH_ROWS]
            offsets = np.zeros(len(part) + 1, np.int32)
            np.cumsum(sizes, out=offsets[1:])  # a shard's batch holds far fewer than 2**31 tokens (cut by shard_mb)
            values = np.concatenate(part).astype(dtype) if part else np.empty(0, dtype)
            tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
            writer.write_batch(pa.record_batch(
                [tokens, pa.array(sizes.astype(np.int32)), pa.array(sources[start : start + BATCH_ROWS], pa.string())],
                schema=schema))
    return write_record(out, name, len(documents), {"tokens": int(lengths.sum())}, rejected, end)


def write_record(out: Path, name: str, rows: int, counts: dict[str, int], rejected: list[dict[str, str]],
                 end: tuple[int, int]) -> dict[str, Any]:
    """Write the record of the complete shard file ``name`` (token or image-text) into ``out/.ingest/``.

    The record is ``{"file", "rows", "bytes", "sha256", **counts, "rejected", "end"}``: ``counts`` what the shard
    holds (``tokens``, ``images``), ``end`` where the next shard's rows start, ``(file, row)``.
    """
    path = out / name
    record = {"file": name, "rows": rows, "bytes": path.stat().st_size, "sha256": file_sha256(path), **counts,
              "rejected": rejected, "end": list(end)}
    record_file = record_path(out, name)
    record_file.parent.mkdir(exist_ok=True)
    atomic_write(record_file, json.dumps(record, sort_keys=True).encode())
    return record


def write_lengths(out: Path, shard_files: list[str]) -> dict[str, Any]:
    """Write ``out/lengths.npy`` (int32) from the ``length`` columns of ``shard_files``; returns its manifest entry."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    pieces = []
    for name in shard_files:
        with pa.memory_map(str(out / name)) as source:
            reader = ipc.open_file(source)
            pieces += [np.array(reader.get_batch(i).column("length").to_numpy()) for i in
                       range(reader.num_record_batches)]
    lengths = np.concatenate(pieces).astype(np.int32) if pieces else np.empty(0, np.int32)
    return save_labels(out, lengths, LENGTHS)
