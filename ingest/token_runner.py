"""``stallfree ingest`` of documents: text tokenized once (or token ids as they are) into token shards.

The same house as the image ingest (:mod:`~stallfree.ingest.runner`): one run at a time holds ``OUT``'s lock
(:mod:`~stallfree.ingest.lock`), the plan's digest goes to ``.ingest/plan.json`` (a rerun into a folder of another
plan is refused), each shard is written atomically and counts as done only when its record exists, and the
manifest comes last. What differs is the cut: a document's size is known only once it is tokenized, so the source
is read in order and a shard is cut as soon as its token ids reach ``shard_mb``; its record says where the next
shard starts, and a rerun after a kill keeps the shards written and reads on from there, writing the same bytes as
an uninterrupted run::

    list files ─► tokenizer, vocab, id type ─► plan.json ─► records done ─► read on from the last record's end:
                                                                              rows ─► encode_batch ─► check ─► shard
    ─► lengths.npy, rejected.jsonl ─► manifest.json ("kind": "tokens")

Without a tokenizer or ``vocab_size`` the id type (uint16 or int32) is decided by the largest id, found by one read
of the source before any shard is written.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from stallfree.ingest.lock import ingest_lock
from stallfree.ingest.manifest import FORMAT, MANIFEST, REJECTED, VERSION, shard_name, write_manifest, write_rejected
from stallfree.ingest.remote import is_url, redact
from stallfree.ingest.runner import DiskFull
from stallfree.ingest.shard_plan import check_plan, resume
from stallfree.ingest.text_sources import Bad, Mode, TextFile, choose_field, count_rows, list_text_files, read_rows
from stallfree.ingest.token_check import document_problem, token_dtype
from stallfree.ingest.token_writer import LENGTHS, TokenOptions, token_schema, write_lengths, write_token_shard
from stallfree.ingest.tokenizer import Specials, TextTokenizer
from stallfree.ingest.writer import RECORDS

__all__ = ["TokenPlan", "ingest_tokens", "plan_tokens", "resumed_records", "special_id", "with_disk_full"]

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class TokenPlan:
    """What a token ingest reads and writes, decided before any shard is: the same on every run of one job."""

    source: Path
    files: list[TextFile]
    rows: list[int]
    mode: Mode
    field: str
    tokenizer: TextTokenizer | None
    specials: Specials
    vocab_size: int | None
    dtype: np.dtype[Any]
    job: str


def plan_tokens(source: str | os.PathLike[str], options: TokenOptions) -> TokenPlan:
    """List ``source``, choose its field, load the tokenizer and decide the id type (see the module's docstring).

    Raises:
        FileNotFoundError: ``source`` or the tokenizer does not exist.
        ImportError: ``tokenizers`` (``transformers`` for a folder) is not installed.
        ValueError: a source of no known kind, a missing or mistyped column, a token the tokenizer lacks, a
            ``vocab_size`` below the tokenizer's.
    """
    path = Path(source)
    files = list_text_files(path)
    mode, field = choose_field(files, options.text_field, options.tokens_field, options.tokenizer is not None)
    tokenizer = (TextTokenizer(options.tokenizer, special_tokens=options.special_tokens)
                 if options.tokenizer is not None else None)
    specials = Specials()
    vocab = options.vocab_size
    if tokenizer is not None:
        specials = Specials(bos=special_id(tokenizer, options.add_bos, "--add-bos", tokenizer.bos_token),
                            eos=special_id(tokenizer, options.add_eos, "--add-eos", tokenizer.eos_token))
        if vocab is not None and vocab < tokenizer.vocab_size:
            raise ValueError(f"--vocab-size {vocab} is below {options.tokenizer}'s vocabulary of "
                             f"{tokenizer.vocab_size}: its ids would be refused; drop --vocab-size")
        vocab = vocab or tokenizer.vocab_size
    if vocab is None and mode == "tokens":
        rows, top = _scan(files, field)
    else:
        rows, top = [count_rows(f, field) for f in files], 0
    dtype = token_dtype(vocab, top)
    decided = {k: v for k, v in options.to_json().items() if k not in ("tokenizer", "on_error")}
    shared = ["tokens", mode, field, decided, tokenizer.identity if tokenizer else None, specials.bos, specials.eos,
              vocab, str(dtype), [[f.name, f.size, n] for f, n in zip(files, rows, strict=True)]]
    job = hashlib.sha256(json.dumps(shared).encode()).hexdigest()
    return TokenPlan(path, files, rows, mode, field, tokenizer, specials, vocab, dtype, job)


def special_id(tokenizer: TextTokenizer, token: str | None, flag: str, default: str | None) -> int | None:
    """The id of the token ``flag`` names; ``""`` names the tokenizer's own (a ``transformers`` tokenizer's)."""
    if token is None:
        return None
    if token == "":
        if default is None:
            raise ValueError(f"{flag}: {tokenizer.path} names no such token of its own; name it, as in {flag} "
                             "'</s>'")
        token = default
    return tokenizer.token_id(token, flag)


def _scan(files: list[TextFile], field: str) -> tuple[list[int], int]:
    """Each file's rows and the largest id of the documents that pass the check (no vocabulary to check against)."""
    rows, top = [], 0
    for file in files:
        count = 0
        for batch in read_rows(file, field, "tokens"):
            count += len(batch)
            for _, value in batch:
                if not isinstance(value, (Bad, str)) and document_problem(value, None) is None:
                    top = max(top, int(value.max()))
        rows.append(count)
    return rows, top


def ingest_tokens(source: str | os.PathLike[str], out: str | os.PathLike[str],
                  options: TokenOptions = TokenOptions(),  # noqa: B008 - frozen, so a shared default is safe
                  *, progress: bool = False) -> dict[str, Any]:
    """Ingest the documents of ``source`` into token shards in ``out``; returns a summary (counts, sizes, rates).

    Args:
        source: a ``.jsonl``/``.json``, ``.parquet`` or ``.csv`` file, or a folder of them (text_sources).
        out: the output folder (created); one holding an unfinished ingest of the same job is resumed.
        options: what to read and how (:class:`~stallfree.ingest.token_writer.TokenOptions`).
        progress: a progress bar (documents) on stderr.

    Raises:
        ValueError: as :func:`plan_tokens`; a bad row under ``on_error="raise"`` (naming the file, the row and why);
            ``out`` holding another job's ingest.
        DiskFull: the disk of ``out`` filled up; the shards written are kept and the same call resumes after them.
        FolderLocked: another ingest is writing ``out`` now (its pid and source named).
    """
    if is_url(out):
        raise ValueError(f"OUT must be a local folder for a token ingest, got the URL {redact(str(out))}: ingest "
                         "locally, then copy the folder")
    if is_url(source):
        raise ValueError(f"SRC must be a local path, got the URL {redact(str(source))}: download it first")
    plan = plan_tokens(source, options)
    folder = Path(out)
    written: dict[int, dict[str, Any]] = {}
    return with_disk_full(folder, os.path.abspath(source), written,
                          lambda: _ingest(plan, folder, options, progress, written))


_T = TypeVar("_T")


def with_disk_full(folder: Path, source: str, written: dict[int, dict[str, Any]], run: Callable[[], _T]) -> _T:
    """``run()`` holding ``folder``'s ingest lock, a full disk turned into :class:`DiskFull`.

    ``source`` names this run to another that is refused; ``written`` (filled by ``run``) counts the shards kept.
    """
    try:
        with ingest_lock(folder, folder / RECORDS, source, (0, 1)):
            return run()
    except OSError as err:
        if isinstance(err, DiskFull) or err.errno not in _DISK_FULL:
            raise
        raise DiskFull(f"no space left on device in {folder}: free some space (or quota) and run the same command "
                       f"again, which keeps the {len(written)} shard(s) written") from err


def resumed_records(out: Path, job: str, records: dict[int, dict[str, Any]],
                    last: tuple[str, ...] = (LENGTHS, REJECTED, MANIFEST)) -> int:
    """Record the plan ``job`` in ``out`` (refusing another's), and the shards already complete in ``records``.

    Returns how many there are. ``last`` are the files written after the shards (their temporaries are removed).
    """
    check_plan(out, job, job, (0, 1))
    known = len(list((out / RECORDS).glob("shard-*.json")))
    found = resume(out, [shard_name(i) for i in range(known + 1)], list(last), (0, 1))
    while len(records) in found:  # shards are written in order: the done ones are a prefix
        records[len(records)] = found[len(records)]
    return len(records)


def _ingest(plan: TokenPlan, out: Path, options: TokenOptions, progress: bool,
            records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    started = time.perf_counter()
    done = resumed_records(out, plan.job, records)
    end = tuple(records[done - 1]["end"]) if done else (0, 0)
    from tqdm import tqdm

    bar = tqdm(total=sum(plan.rows), unit="doc", file=sys.stderr, disable=not progress, dynamic_ncols=True,
               desc="ingest", smoothing=0.1)
    bar.update(sum(r["rows"] + len(r["rejected"]) for r in records.values()))  # every row before ``end``
    try:
        trailing = _write(plan, out, options, records, (int(end[0]), int(end[1])), bar)
    finally:
        bar.close()
    rejected = [r for i in sorted(records) for r in records[i]["rejected"]] + trailing
    files = [records[i]["file"] for i in sorted(records)]
    lengths = write_lengths(out, files)  # before the manifest, which lists it
    write_rejected(out, rejected)
    manifest = _manifest(plan, options, records, lengths, len(rejected))
    write_manifest(out / MANIFEST, manifest)
    seconds = time.perf_counter() - started
    fresh = [records[i] for i in sorted(records) if i >= done]
    return {
        "documents": manifest["documents"],
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


def _documents(plan: TokenPlan, start: tuple[int, int]) -> Iterator[list[tuple[int, int, np.ndarray | Bad]]]:
    """Batches of ``(file, row, ids or Bad)`` from ``start`` on, in order: text encoded, every document checked."""
    for index in range(start[0], len(plan.files)):
        file = plan.files[index]
        for batch in read_rows(file, plan.field, plan.mode, start[1] if index == start[0] else 0):
            texts = [v for _, v in batch if isinstance(v, str)]  # text mode only (a tokens plan reads arrays)
            encoded = iter(plan.tokenizer.encode(texts) if plan.tokenizer is not None and texts else [])
            checked: list[tuple[int, int, np.ndarray | Bad]] = []
            for row, read in batch:
                value = next(encoded) if isinstance(read, str) else read
                if not isinstance(value, Bad):
                    value = plan.specials.apply(value)
                    problem = document_problem(value, plan.vocab_size)
                    value = Bad(problem) if problem is not None else value
                checked.append((index, row, value))
            yield checked


def _write(plan: TokenPlan, out: Path, options: TokenOptions, records: dict[int, dict[str, Any]],
           start: tuple[int, int], bar: Any) -> list[dict[str, str]]:
    """Write the shards from ``start`` on into ``records``; returns the rows rejected after the last shard's end."""
    target = options.shard_mb * 1e6
    width = plan.dtype.itemsize
    documents: list[np.ndarray] = []
    sources: list[str] = []
    rejected: list[dict[str, str]] = []
    size = 0
    for batch in _documents(plan, start):
        for index, row, value in batch:
            name = plan.files[index].name
            if isinstance(value, Bad):
                if options.on_error == "raise":
                    raise ValueError(f"{plan.files[index].path} row {row}: {value.reason}; fix the row, or pass "
                                     "--on-error skip to leave such rows out (listed in OUT/rejected.jsonl)")
                rejected.append({"path": f"{name}:{row}", "reason": value.reason})
                continue
            documents.append(value)
            sources.append(f"{name}:{row}")
            size += len(value) * width
            if size >= target:
                _shard(plan, out, records, documents, sources, rejected, (index, row + 1))
                documents, sources, rejected, size = [], [], [], 0
        bar.update(len(batch))
    if documents or not records:  # the last shard; an empty one where nothing was ingested, as images have
        _shard(plan, out, records, documents, sources, rejected, (len(plan.files), 0))
        rejected = []
    return rejected


def _shard(plan: TokenPlan, out: Path, records: dict[int, dict[str, Any]], documents: list[np.ndarray],
           sources: list[str], rejected: list[dict[str, str]], end: tuple[int, int]) -> None:
    index = len(records)
    records[index] = write_token_shard(out, shard_name(index), documents, sources, plan.dtype, rejected, end)


def _manifest(plan: TokenPlan, options: TokenOptions, records: dict[int, dict[str, Any]], lengths: dict[str, Any],
              rejected: int) -> dict[str, Any]:
    schema = token_schema(plan.dtype)
    rows = sum(r["rows"] for r in records.values())
    tokenizer = plan.tokenizer
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": "tokens",
        "plan": {"digest": plan.job, "job": plan.job, "shards": len(records)},
        "schema": [{"name": f.name, "type": str(f.type)} for f in schema],
        "shards": [{k: records[i][k] for k in ("file", "rows", "bytes", "sha256", "tokens")} for i in sorted(records)],
        "rows": rows,
        "documents": rows,
        "tokens": sum(r["tokens"] for r in records.values()),
        "vocab_size": plan.vocab_size,
        "token_dtype": str(plan.dtype),
        "classes": [],
        "lengths": lengths,
        "source": {"kind": plan.mode, "path": str(plan.source), "field": plan.field,
                   "files": [f.name for f in plan.files]},
        "tokenizer": None if tokenizer is None else {
            "path": str(tokenizer.path), "sha256": tokenizer.identity, "special_tokens": tokenizer.special_tokens,
            "bos_id": plan.specials.bos, "eos_id": plan.specials.eos},
        "options": options.to_json(),
        "rejected": rejected,
    }
