"""``stallfree ingest --layout``: image-text rows (caption pairs, LLaVA conversations) into image-text shards.

The house of the token ingest (:mod:`~stallfree.ingest.token_runner`), whose parts it uses: one run at a time holds
``OUT``'s lock, the plan's digest goes to ``.ingest/plan.json`` (a rerun into a folder of another plan is refused),
the source is read in order and a shard cut as soon as its token ids and image bytes reach ``shard_mb``, each
shard's record says where the next starts, and a rerun after a kill keeps the shards written and reads on from
there, writing the same bytes as an uninterrupted run::

    list files (or a datasets.Dataset) ─► tokenizer, specials ─► plan.json ─► records done ─► from the last end:
        rows ─► layout (conversation.py) ─► images read and checked (image_refs.py) ─► encode (image_text_tokens.py)
        ─► shard (image_text_writer.py) ─► lengths.npy, image_counts.npy, rejected.jsonl ─► manifest.json

A bad row (a missing field, empty text, a role it does not know, placeholders that do not match the images, an
image missing, unreadable or refused by the one image check) raises naming the file, the row and why
(``on_error="raise"``), or is left out and listed in ``rejected.jsonl`` (``"skip"``): a sample goes in whole, with
all its images, or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from stallfree.ingest.conversation import Piece, RowProblem, caption_pieces, conversation_pieces
from stallfree.ingest.image_refs import ImageProblem, image_refs, load_image
from stallfree.ingest.image_text_tokens import encode_samples
from stallfree.ingest.image_text_writer import (
    DEFAULT_PLACEHOLDER,
    IMAGE_COUNTS,
    LAYOUTS,
    ImageTextDocument,
    Layout,
    image_text_manifest,
    write_image_text_shard,
)
from stallfree.ingest.images import DEFAULT_MAX_PIXELS
from stallfree.ingest.manifest import MANIFEST, REJECTED, shard_name
from stallfree.ingest.record_sources import RecordFile, columns, is_dataset, list_record_files, read_records
from stallfree.ingest.remote import is_url, redact
from stallfree.ingest.text_sources import Bad
from stallfree.ingest.token_check import document_problem, token_dtype
from stallfree.ingest.token_runner import resumed_records, special_id, with_disk_full
from stallfree.ingest.token_writer import LENGTHS
from stallfree.ingest.tokenizer import Specials, TextTokenizer

__all__ = ["ImageTextOptions", "ImageTextPlan", "ingest_image_text", "plan_image_text"]

#: How a lock, a manifest and a message name a ``datasets.Dataset`` source.
DATASET_NAME = "datasets.Dataset"
#: The end token of each assistant reply in LLaVA v1's template, where the tokenizer names no EOS of its own.
_END = "</s>"


@dataclass(frozen=True)
class ImageTextOptions:
    """What an image-text ingest reads and how (all of it but ``on_error`` decides the shards' bytes).

    Args:
        layout: ``"caption"`` (images and a text) or ``"conversations"`` (LLaVA's layout; :mod:`.conversation`).
        tokenizer: a local ``tokenizer.json`` or ``transformers`` tokenizer folder (required).
        image_field: the field of a row's images (one, or a list; default ``image``, else ``images``).
        text_field: a caption's text field.
        conversations_field: a conversation's list of turns.
        image_root: the folder relative image paths start from (default: the source file's folder; for a
            ``datasets.Dataset``, the working folder).
        image_placeholder: the text that marks an image's place in a conversation.
        special_tokens, add_bos, add_eos, vocab_size, shard_mb: as for token ingest
            (:class:`~stallfree.ingest.token_writer.TokenOptions`); ``shard_mb`` counts image bytes too.
        max_pixels: refuse images whose header claims more pixels.
        on_error: a bad row raises ``ValueError`` naming the file and row (``"raise"``) or is left out and listed in
            ``rejected.jsonl`` (``"skip"``).
    """

    layout: Layout = "caption"
    tokenizer: str | None = None
    image_field: str | None = None
    text_field: str = "text"
    conversations_field: str = "conversations"
    image_root: str | None = None
    image_placeholder: str = DEFAULT_PLACEHOLDER
    special_tokens: bool = True
    add_bos: str | None = None
    add_eos: str | None = None
    vocab_size: int | None = None
    shard_mb: float = 256.0
    max_pixels: int = DEFAULT_MAX_PIXELS
    on_error: Literal["raise", "skip"] = "skip"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"--layout must be one of {list(LAYOUTS)}, got {self.layout!r}")
        if self.tokenizer is None:
            raise ValueError(f"--layout {self.layout} tokenizes text at ingest: pass --tokenizer PATH (a "
                             "tokenizer.json, or a transformers tokenizer folder)")
        if not self.shard_mb > 0:
            raise ValueError(f"--shard-size must be positive MB, got {self.shard_mb}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"--vocab-size must be >= 1, got {self.vocab_size}")
        if self.max_pixels < 1:
            raise ValueError(f"--max-pixels must be positive, got {self.max_pixels}")
        if not self.image_placeholder:
            raise ValueError("--image-placeholder must not be empty")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"--on-error must be 'raise' or 'skip', got {self.on_error!r}")

    def to_json(self) -> dict[str, Any]:
        """The options as JSON values."""
        return asdict(self)


@dataclass(frozen=True)
class ImageTextPlan:
    """What an image-text ingest reads and writes, decided before any shard is: the same on every run of one job."""

    where: str
    files: list[RecordFile]
    roots: list[Path]
    fields: list[str]
    tokenizer: TextTokenizer
    specials: Specials
    end: str
    vocab_size: int
    dtype: np.dtype[Any]
    job: str


def plan_image_text(source: Any, options: ImageTextOptions) -> ImageTextPlan:
    """List ``source`` (a path or a ``datasets.Dataset``), load the tokenizer, and decide the id type.

    Raises:
        FileNotFoundError: ``source``, the tokenizer or ``image_root`` does not exist.
        ValueError: a source of no known kind; a Parquet file or dataset lacking the layout's columns (named, with
            the columns it has); a token the tokenizer lacks; a ``vocab_size`` below the tokenizer's.
    """
    files = list_record_files(source)
    images = [options.image_field] if options.image_field else ["image", "images"]
    text = options.text_field if options.layout == "caption" else options.conversations_field
    for file in files:
        held = columns(file)
        missing = [text] if held is not None and text not in held else []
        if held is not None and not any(name in held for name in images) and options.layout == "caption":
            missing.append(" or ".join(images))
        if missing:
            flags = "--image-field/--text-field" if options.layout == "caption" else "--conversations-field"
            raise ValueError(f"{_where(file)} has no column {' nor '.join(map(repr, missing))} for --layout "
                             f"{options.layout}; its columns are {held}: name them with {flags}")
    if options.image_root is not None and not Path(options.image_root).is_dir():
        raise FileNotFoundError(f"--image-root {options.image_root} is not a folder")
    roots = [Path(options.image_root) if options.image_root is not None
             else f.text.path.parent if f.text is not None else Path.cwd() for f in files]
    tokenizer = TextTokenizer(str(options.tokenizer), special_tokens=options.special_tokens)
    specials = Specials(bos=special_id(tokenizer, options.add_bos, "--add-bos", tokenizer.bos_token),
                        eos=special_id(tokenizer, options.add_eos, "--add-eos", tokenizer.eos_token))
    if options.vocab_size is not None and options.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"--vocab-size {options.vocab_size} is below {options.tokenizer}'s vocabulary of "
                         f"{tokenizer.vocab_size}: its ids would be refused; drop --vocab-size")
    vocab = options.vocab_size or tokenizer.vocab_size
    dtype = token_dtype(vocab, 0)
    end = tokenizer.eos_token or _END
    decided = {k: v for k, v in options.to_json().items() if k not in ("tokenizer", "on_error", "image_root")}
    identity = [[f.name, f.size, f.rows, getattr(f.dataset, "_fingerprint", None)] for f in files]
    shared = ["image_text", decided, tokenizer.identity, specials.bos, specials.eos, end, vocab, str(dtype),
              [str(r.resolve()) for r in roots], identity]
    job = hashlib.sha256(json.dumps(shared).encode()).hexdigest()
    where = DATASET_NAME if is_dataset(source) else os.path.abspath(source)
    return ImageTextPlan(where, files, roots, [*images, text], tokenizer, specials, end, vocab, dtype, job)


def _where(file: RecordFile) -> str:
    return file.text.path.as_posix() if file.text is not None else f"the {DATASET_NAME}"


def ingest_image_text(source: Any, out: str | os.PathLike[str], options: ImageTextOptions, *,
                      progress: bool = False) -> dict[str, Any]:
    """Ingest the image-text rows of ``source`` into image-text shards in ``out``; returns a summary.

    Args:
        source: a ``.jsonl``/``.json`` or ``.parquet`` file, a folder of them, or a ``datasets.Dataset``.
        out: the output folder (created); one holding an unfinished ingest of the same job is resumed.
        options: what to read and how (:class:`ImageTextOptions`).
        progress: a progress bar (rows) on stderr.

    Raises:
        ValueError: as :func:`plan_image_text`; a bad row under ``on_error="raise"`` (naming the file, the row and
            why); ``out`` holding another job's ingest.
        DiskFull: the disk of ``out`` filled up; the shards written are kept and the same call resumes after them.
        FolderLocked: another ingest is writing ``out`` now (its pid and source named).
    """
    if is_url(out):
        raise ValueError(f"OUT must be a local folder for an image-text ingest, got the URL {redact(str(out))}: "
                         "ingest locally, then copy the folder")
    if not is_dataset(source) and is_url(source):
        raise ValueError(f"SRC must be a local path, got the URL {redact(str(source))}: download it first")
    plan = plan_image_text(source, options)
    folder = Path(out)
    written: dict[int, dict[str, Any]] = {}
    return with_disk_full(folder, plan.where, written, lambda: _ingest(plan, folder, options, progress, written))


def _ingest(plan: ImageTextPlan, out: Path, options: ImageTextOptions, progress: bool,
            records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    done = resumed_records(out, plan.job, records, (LENGTHS, IMAGE_COUNTS, REJECTED, MANIFEST))
    end = tuple(records[done - 1]["end"]) if done else (0, 0)
    from tqdm import tqdm

    bar = tqdm(total=sum(f.rows for f in plan.files), unit="row", file=sys.stderr, disable=not progress,
               dynamic_ncols=True, desc="ingest", smoothing=0.1)
    bar.update(sum(r["rows"] + len(r["rejected"]) for r in records.values()))  # every row before ``end``
    try:
        trailing = _write(plan, out, options, records, (int(end[0]), int(end[1])), bar)
    finally:
        bar.close()
    rejected = [r for i in sorted(records) for r in records[i]["rejected"]] + trailing
    tokenizer = plan.tokenizer
    manifest = image_text_manifest(
        out, [records[i] for i in sorted(records)], rejected, dtype=plan.dtype, vocab_size=plan.vocab_size,
        layout=options.layout, placeholder=options.image_placeholder,
        tokenizer={"path": str(tokenizer.path), "sha256": tokenizer.identity,
                   "special_tokens": tokenizer.special_tokens, "bos_id": plan.specials.bos,
                   "eos_id": plan.specials.eos, "reply_end": plan.end},
        job=plan.job, options=options.to_json(),
        source={"kind": options.layout, "path": plan.where, "fields": plan.fields,
                "files": [f.name for f in plan.files]})
    seconds = time.perf_counter() - started
    fresh = [records[i] for i in sorted(records) if i >= done]
    return {
        "kind": "image_text",
        "layout": options.layout,
        "documents": manifest["documents"],
        "images": manifest["images"],
        "tokens": manifest["tokens"],
        "rejected": len(rejected),
        "shards": len(records),
        "written_shards": len(fresh),
        "resumed_shards": done,
        "token_dtype": manifest["token_dtype"],
        "vocab_size": plan.vocab_size,
        "source_mb": sum(f.size for f in plan.files) / 1e6,
        "shard_mb": sum(r["bytes"] for r in records.values()) / 1e6,
        "seconds": seconds,
        "documents_per_s": sum(r["rows"] for r in fresh) / seconds if seconds else 0.0,
        "tokens_per_s": sum(r["tokens"] for r in fresh) / seconds if seconds else 0.0,
    }


def _pieces(plan: ImageTextPlan, options: ImageTextOptions, record: dict[str, Any]) -> tuple[list[Piece], list[Any]]:
    """A row's rendered pieces and its image references (:mod:`.conversation`, :mod:`.image_refs`)."""
    field = options.image_field or ("image" if "image" in record else "images")
    if options.layout == "caption":
        for name in (field, options.text_field):
            if name not in record:
                shown = repr(name) if options.image_field or name != field else "'image' nor 'images'"
                raise RowProblem(f"no field {shown} (its fields: {sorted(record)[:10]})")
        refs = image_refs(record[field], field)
        return caption_pieces(record[options.text_field], len(refs), options.text_field), refs
    if options.conversations_field not in record:
        raise RowProblem(f"no field {options.conversations_field!r} (its fields: {sorted(record)[:10]})")
    refs = image_refs(record.get(field), field)  # no image field: a text-only conversation
    turns = record[options.conversations_field]
    return conversation_pieces(turns, len(refs), options.conversations_field, options.image_placeholder,
                               plan.end), refs


def _documents(plan: ImageTextPlan, options: ImageTextOptions,
               start: tuple[int, int]) -> Iterator[list[tuple[int, int, ImageTextDocument | Bad]]]:
    """Batches of ``(file, row, document or Bad)`` from ``start`` on, in order: each row rendered, read, encoded."""
    for index in range(start[0], len(plan.files)):
        file = plan.files[index]
        for batch in read_records(file, plan.fields, start[1] if index == start[0] else 0):
            read: list[tuple[int, Any]] = []
            for row, record in batch:
                if isinstance(record, Bad):
                    read.append((row, record))
                    continue
                try:
                    pieces, refs = _pieces(plan, options, record)
                    images = [load_image(ref, plan.roots[index], f"image {i}", options.max_pixels)
                              for i, ref in enumerate(refs)]
                except (RowProblem, ImageProblem) as err:
                    read.append((row, Bad(str(err))))
                else:
                    read.append((row, (pieces, images)))
            good = [value for _, value in read if not isinstance(value, Bad)]
            encoded = iter(encode_samples(plan.tokenizer, [pieces for pieces, _ in good], plan.specials,
                                          options.layout == "caption"))
            checked: list[tuple[int, int, ImageTextDocument | Bad]] = []
            for row, value in read:
                if isinstance(value, Bad):
                    checked.append((index, row, value))
                    continue
                tokens, at, assistant = next(encoded)
                problem = document_problem(tokens, plan.vocab_size)
                images = value[1]
                checked.append((index, row, Bad(problem) if problem is not None else ImageTextDocument(
                    tokens, [data for data, _ in images], at, [size for _, size in images], assistant,
                    f"{file.name}:{row}")))
            yield checked


def _write(plan: ImageTextPlan, out: Path, options: ImageTextOptions, records: dict[int, dict[str, Any]],
           start: tuple[int, int], bar: Any) -> list[dict[str, str]]:
    """Write the shards from ``start`` on into ``records``; returns the rows rejected after the last shard's end."""
    target = options.shard_mb * 1e6
    documents: list[ImageTextDocument] = []
    rejected: list[dict[str, str]] = []
    size = 0
    for batch in _documents(plan, options, start):
        for index, row, value in batch:
            file = plan.files[index]
            if isinstance(value, Bad):
                if options.on_error == "raise":
                    where = file.text.path if file.text is not None else file.name
                    raise ValueError(f"{where} row {row}: {value.reason}; fix the row, or pass --on-error skip to "
                                     "leave such rows out (listed in OUT/rejected.jsonl)")
                rejected.append({"path": f"{file.name}:{row}", "reason": value.reason})
                continue
            documents.append(value)
            size += len(value.tokens) * plan.dtype.itemsize + sum(len(image) for image in value.images)
            if size >= target:
                _shard(plan, out, records, documents, rejected, (index, row + 1))
                documents, rejected, size = [], [], 0
        bar.update(len(batch))
    if documents or not records:  # the last shard; an empty one where nothing was ingested, as tokens have
        _shard(plan, out, records, documents, rejected, (len(plan.files), 0))
        rejected = []
    return rejected


def _shard(plan: ImageTextPlan, out: Path, records: dict[int, dict[str, Any]], documents: list[ImageTextDocument],
           rejected: list[dict[str, str]], end: tuple[int, int]) -> None:
    index = len(records)
    records[index] = write_image_text_shard(out, shard_name(index), documents, plan.dtype, rejected, end)
