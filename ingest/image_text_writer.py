"""Writing image-text shards: one Arrow file per shard, ``lengths.npy``, ``image_counts.npy`` and the manifest.

An image-text shard (kind ``"image_text"``) is an uncompressed Arrow IPC file, as a token shard is
(:mod:`~stallfree.ingest.token_writer`), of these columns::

    tokens       list<uint16|int32>  the document's text token ids (no vision tokens: their count is the Loader's)
    length       int32               len(tokens)
    images       list<binary>        the encoded images, in the order they appear in the text
    image_at     list<int32>         per image, the index in ``tokens`` before which it goes; non-decreasing
    image_sizes  list<int32>         per image, its height then its width (from the one image check)
    assistant    list<uint8>         per token: 1 if it is a target (an assistant reply and its end token; every
                                     token of a caption), 0 otherwise (prompt, user turns, template text)
    source       string              where it came from: "FILE:ROW"

Each shard is written under a temporary name and renamed when complete, then its record goes to ``.ingest/`` as a
token shard's does (with its image count besides), so a rerun after a kill resumes after the last record's
``end``. ``lengths.npy`` (int32, text tokens per document) and ``image_counts.npy`` (int32, images per document)
are written from the shards' columns before the manifest, which lists them (``"lengths"``, ``"image_counts"``), so
a reader knows every document's length and image count without opening a shard.

:func:`write_image_text_shards` writes a whole folder from Python (documents already tokenized and checked by the
caller; each is checked here for consistency); ``stallfree ingest --layout`` (:mod:`.image_text_runner`) streams
rows through :func:`write_image_text_shard` and :func:`image_text_manifest`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from stallfree.core.atomic import atomic_path, atomic_write
from stallfree.ingest.labels import save_labels
from stallfree.ingest.manifest import FORMAT, MANIFEST, VERSION, file_sha256, shard_name, write_manifest, write_rejected
from stallfree.ingest.token_check import document_problem, token_dtype
from stallfree.ingest.token_writer import write_lengths
from stallfree.ingest.tokenizer import TextTokenizer
from stallfree.ingest.writer import BATCH_ROWS, RECORDS, record_path

__all__ = [
    "DEFAULT_PLACEHOLDER", "IMAGE_COUNTS", "LAYOUTS", "ImageTextDocument", "Layout", "document_inconsistency",
    "image_text_manifest", "image_text_schema", "shard_image_counts", "write_image_counts", "write_image_text_shard",
    "write_image_text_shards",
]

#: Every document's image count, beside the manifest (listed under its ``"image_counts"``).
IMAGE_COUNTS = "image_counts.npy"
#: The sample layouts an image-text source is read in: a caption pair, or a LLaVA-style conversation.
Layout = Literal["caption", "conversations"]
LAYOUTS: tuple[Layout, ...] = ("caption", "conversations")
#: The text that marks where an image goes in a conversation (LLaVA's).
DEFAULT_PLACEHOLDER = "<image>"


@dataclass(frozen=True)
class ImageTextDocument:
    """One image-text sample, ready to write: text ids, encoded images and where each image goes.

    Args:
        tokens: the text's token ids (1-D integers).
        images: the encoded images (JPEG, PNG...: what the one image check takes), in the order they appear.
        image_at: per image, the index in ``tokens`` before which it goes (``len(tokens)``: after the last token).
        image_sizes: per image, ``(height, width)``.
        assistant: per token, 1 for a target token, 0 otherwise (uint8, ``len(tokens)``).
        source: where it came from, ``"FILE:ROW"``.
    """

    tokens: np.ndarray
    images: list[bytes]
    image_at: list[int]
    image_sizes: list[tuple[int, int]]
    assistant: np.ndarray
    source: str


def document_inconsistency(document: ImageTextDocument, vocab_size: int | None) -> str | None:
    """Why ``document`` cannot be written (its parts disagree, or its ids are no document), or None."""
    tokens = np.asarray(document.tokens)
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        return f"tokens must be a 1-D integer array, got {tokens.dtype} of shape {tokens.shape}"
    problem = document_problem(tokens, vocab_size)
    if problem is not None:
        return problem
    count = len(document.images)
    if len(document.image_at) != count or len(document.image_sizes) != count:
        return (f"{count} image(s) but {len(document.image_at)} image_at and {len(document.image_sizes)} "
                "image_sizes entries: one of each per image")
    at = np.asarray(document.image_at, np.int64)
    if count and (at.min() < 0 or at.max() > len(tokens) or np.any(np.diff(at) < 0)):
        return f"image_at {list(document.image_at)} must be non-decreasing positions in 0..{len(tokens)}"
    if any(len(size) != 2 or min(size) < 1 for size in document.image_sizes):
        return f"image_sizes {list(document.image_sizes)} must be (height, width) pairs of positive sides"
    if not all(isinstance(image, bytes) and image for image in document.images):
        return "images must be non-empty bytes (encoded images)"
    assistant = np.asarray(document.assistant)
    if assistant.shape != tokens.shape or (len(assistant) and not np.isin(assistant, (0, 1)).all()):
        return f"assistant must hold one 0 or 1 per token ({len(tokens)}), got shape {assistant.shape}"
    return None


def image_text_schema(dtype: np.dtype[Any]) -> Any:
    """The Arrow schema of an image-text shard whose token ids are ``dtype`` (uint16 or int32)."""
    import pyarrow as pa

    return pa.schema([
        pa.field("tokens", pa.list_(pa.from_numpy_dtype(dtype))), pa.field("length", pa.int32()),
        pa.field("images", pa.list_(pa.binary())), pa.field("image_at", pa.list_(pa.int32())),
        pa.field("image_sizes", pa.list_(pa.int32())), pa.field("assistant", pa.list_(pa.uint8())),
        pa.field("source", pa.string()),
    ], metadata={"stallfree": "1", "kind": "image_text"})


def _list(values: list[np.ndarray], dtype: Any) -> Any:
    """An Arrow list array of the 1-D ``values`` (each as ``dtype``)."""
    import pyarrow as pa

    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])  # a batch holds far fewer than 2**31 values (shard_mb)
    flat = np.concatenate(values).astype(dtype) if values else np.empty(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def write_image_text_shard(out: Path, name: str, documents: list[ImageTextDocument], dtype: np.dtype[Any],
                           rejected: list[dict[str, str]], end: tuple[int, int]) -> dict[str, Any]:
    """Write the shard file ``name`` of ``documents`` (checked, in order) into ``out``, then its record.

    The record is a token shard's (``{"file", "rows", "bytes", "sha256", "tokens", "rejected", "end"}``) with
    ``"images"``, the images it holds.
    """
    import pyarrow as pa
    import pyarrow.ipc as ipc

    schema = image_text_schema(dtype)
    path = out / name
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema) as writer:
        for start in range(0, max(len(documents), 1), BATCH_ROWS):
            part = documents[start : start + BATCH_ROWS]
            images = pa.array([d.images for d in part], pa.list_(pa.binary()))
            sizes = [np.asarray(d.image_sizes, np.int32).reshape(-1) for d in part]
            writer.write_batch(pa.record_batch([
                _list([np.asarray(d.tokens) for d in part], dtype),
                pa.array(np.array([len(d.tokens) for d in part], np.int32)),
                images,
                _list([np.asarray(d.image_at, np.int32) for d in part], np.int32),
                _list(sizes, np.int32),
                _list([np.asarray(d.assistant, np.uint8) for d in part], np.uint8),
                pa.array([d.source for d in part], pa.string()),
            ], schema=schema))
    record = {
        "file": name,
        "rows": len(documents),
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
        "tokens": int(sum(len(d.tokens) for d in documents)),
        "images": int(sum(len(d.images) for d in documents)),
        "rejected": rejected,
        "end": list(end),
    }
    record_file = record_path(out, name)
    record_file.parent.mkdir(exist_ok=True)
    atomic_write(record_file, json.dumps(record, sort_keys=True).encode())
    return record


def write_image_counts(out: Path, shard_files: list[str]) -> dict[str, Any]:
    """Write ``out/image_counts.npy`` (int32) from the ``images`` columns of ``shard_files``; returns its entry."""
    pieces = [shard_image_counts(out / name) for name in shard_files]
    counts = np.concatenate(pieces).astype(np.int32) if pieces else np.empty(0, np.int32)
    return save_labels(out, counts, IMAGE_COUNTS)


def shard_image_counts(path: Path) -> np.ndarray:
    """The images per row (int32) of the image-text shard at ``path``, from its ``images`` column's offsets."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    pieces = [np.empty(0, np.int32)]
    with pa.memory_map(str(path)) as source:
        reader = ipc.open_file(source)
        for i in range(reader.num_record_batches):
            column = reader.get_batch(i).column("images")
            pieces.append(np.diff(column.offsets.to_numpy()).astype(np.int32))
    return np.concatenate(pieces)


def _tokenizer_entry(tokenizer: TextTokenizer | None, bos: int | None, eos: int | None) -> dict[str, Any] | None:
    if tokenizer is None:
        return None
    return {"path": str(tokenizer.path), "sha256": tokenizer.identity, "special_tokens": tokenizer.special_tokens,
            "bos_id": bos, "eos_id": eos}


def image_text_manifest(out: Path, records: list[dict[str, Any]], rejected: list[dict[str, str]], *,
                        dtype: np.dtype[Any], vocab_size: int | None, layout: Layout, placeholder: str,
                        tokenizer: dict[str, Any] | None, job: str, source: dict[str, Any],
                        options: dict[str, Any]) -> dict[str, Any]:
    """Write ``lengths.npy``, ``image_counts.npy``, ``rejected.jsonl`` and the manifest (last); returns it.

    ``records`` are the shards' records in order; ``tokenizer`` the manifest's tokenizer entry (a token manifest's).
    """
    files = [r["file"] for r in records]
    lengths = write_lengths(out, files)
    counts = write_image_counts(out, files)
    write_rejected(out, rejected)
    schema = image_text_schema(dtype)
    rows = sum(r["rows"] for r in records)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "kind": "image_text",
        "layout": layout,
        "plan": {"digest": job, "job": job, "shards": len(records)},
        "schema": [{"name": f.name, "type": str(f.type)} for f in schema],
        "shards": [{k: r[k] for k in ("file", "rows", "bytes", "sha256", "tokens", "images")} for r in records],
        "rows": rows,
        "documents": rows,
        "tokens": sum(r["tokens"] for r in records),
        "images": sum(r["images"] for r in records),
        "image_placeholder": placeholder,
        "vocab_size": vocab_size,
        "token_dtype": str(dtype),
        "classes": [],
        "lengths": lengths,
        "image_counts": counts,
        "source": source,
        "tokenizer": tokenizer,
        "options": options,
        "rejected": len(rejected),
    }
    write_manifest(out / MANIFEST, manifest)
    return manifest


def write_image_text_shards(out: str | os.PathLike[str], documents: Iterable[ImageTextDocument], *,
                            vocab_size: int | None = None, layout: Layout = "caption",
                            tokenizer: TextTokenizer | str | os.PathLike[str] | None = None, shard_mb: float = 256.0,
                            image_placeholder: str = DEFAULT_PLACEHOLDER) -> dict[str, Any]:
    """Write ``documents`` as image-text shards into the folder ``out`` (created); returns the manifest.

    Shards are cut when their token ids and image bytes reach ``shard_mb`` MB. The images are written as given, not
    through the image check (``stallfree ingest`` checks them; the Loader checks each again as it reads it), so a
    test can write a broken one on purpose. The token type is uint16 when
    ``vocab_size`` (default: the tokenizer's vocabulary, else the largest id + 1) is at most 65,536, else int32.

    Raises:
        ValueError: a document whose parts disagree (:func:`document_inconsistency`; naming its ``source``), an id
            at or beyond ``vocab_size``, an unknown ``layout``, or ``out`` already holding a manifest.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    if not shard_mb > 0:
        raise ValueError(f"shard_mb must be positive MB, got {shard_mb}")
    folder = Path(out)
    if (folder / MANIFEST).exists():
        raise ValueError(f"{folder} already holds a dataset ({MANIFEST}); pass an empty folder")
    loaded = tokenizer if isinstance(tokenizer, TextTokenizer) or tokenizer is None else TextTokenizer(tokenizer)
    vocab = vocab_size if vocab_size is not None else (loaded.vocab_size if loaded is not None else None)
    docs = list(documents)
    for document in docs:
        problem = document_inconsistency(document, vocab)
        if problem is not None:
            raise ValueError(f"document {document.source}: {problem}")
    top = max((int(np.max(d.tokens)) for d in docs), default=0)
    dtype = token_dtype(vocab, top)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RECORDS).mkdir(exist_ok=True)
    records: list[dict[str, Any]] = []
    start, size = 0, 0
    for i, document in enumerate(docs):
        size += len(document.tokens) * dtype.itemsize + sum(len(image) for image in document.images)
        if size >= shard_mb * 1e6 or i == len(docs) - 1:
            records.append(write_image_text_shard(folder, shard_name(len(records)), docs[start : i + 1], dtype, [],
                                                  (0, i + 1)))
            start, size = i + 1, 0
    if not records:  # an empty dataset has one empty shard, as an ingest of nothing has
        records.append(write_image_text_shard(folder, shard_name(0), [], dtype, [], (0, 0)))
    job = hashlib.sha256(json.dumps([layout, image_placeholder, [r["sha256"] for r in records]]).encode()).hexdigest()
    return image_text_manifest(
        folder, records, [], dtype=dtype, vocab_size=vocab, layout=layout, placeholder=image_placeholder,
        tokenizer=_tokenizer_entry(loaded, None, None), job=job, source={"kind": "python"},
        options={"shard_mb": shard_mb})
