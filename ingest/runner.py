"""``stallfree ingest``: list a source, cut it into shards, write them in parallel, then the manifest.

The cut is decided from the listing alone (sample sizes from the file system, the tar index or Parquet metadata),
so every run, resumed or not, numbers the same samples into the same shards::

    plan_source(SRC, part) ─► cut into shards by size ─► skip shards whose ─► workers convert chunks;
      └ .ingest/plan.json (digest)                        record exists       shards written in order ─► manifest

A rerun after a crash or ``kill -9`` skips every shard whose record exists and writes the rest. Split with
``--part i/N``, a part lists only its share of the source (:func:`~stallfree.ingest.sources.part_units`: its
contiguous run of class folders, rows, row groups or tars), so that no part pays for the whole listing; it cuts
and names its own shards (``shard-I-of-N-NNNNN.arrow``) and writes ``manifest.part-I-of-N.json``, and
:func:`~stallfree.ingest.merge.merge` joins the parts, in order, into ``manifest.json``. The merged dataset holds
the samples of a one-part ingest in the same order; only where shards begin and end differs. An
``out`` that is a URL writes into a local staging folder and uploads each shard once it is complete, the manifest
last (:mod:`~stallfree.ingest.upload`).
"""

from __future__ import annotations

import errno
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from stallfree.ingest.labels import write_labels
from stallfree.ingest.lock import ingest_lock
from stallfree.ingest.manifest import (
    FORMAT,
    LABELS,
    MANIFEST,
    REJECTED,
    VERSION,
    part_file,
    shard_name,
    write_manifest,
    write_rejected,
)
from stallfree.ingest.remote import Retry, is_url, redact
from stallfree.ingest.shard_plan import check_plan, cut, job_digest, plan_digest, resume, sizes
from stallfree.ingest.sources import Plan, plan_source
from stallfree.ingest.upload import Upload, upload_target
from stallfree.ingest.workers import converted
from stallfree.ingest.writer import RECORDS, Converted, IngestOptions, _schema, write_shard

__all__ = ["DiskFull", "ingest", "parse_part"]

#: Samples per unit of work sent to a worker process.
CHUNK = 64


def parse_part(text: str) -> tuple[int, int]:
    """``"i/N"`` as ``(i, N)``, with ``0 <= i < N``."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not int(match[1]) < int(match[2]):
        raise ValueError(f"--part must be i/N with 0 <= i < N (e.g. 0/4), got {text!r}")
    return int(match[1]), int(match[2])


class DiskFull(OSError):
    """The output folder's disk (or the user's quota) is full.

    The message names the folder, the space still needed and what to do; the shards already written are kept, and
    the same command resumes after them.
    """

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return str(self.strerror)


#: What a full disk (or quota) answers a write with.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _progress(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="img", file=sys.stderr, disable=not enabled, dynamic_ncols=True,
                desc="ingest", smoothing=0.1)


def _manifest(plan: Plan, options: IngestOptions, digest: str, job: str, total_shards: int,
              records: dict[int, dict[str, Any]]) -> dict[str, Any]:
    schema = _schema(plan.extra_columns, options)
    counts = [0] * len(plan.classes)
    for record in records.values():
        for label, count in record["class_counts"].items():
            counts[int(label)] += count
    return {
        "format": FORMAT,
        "version": VERSION,
        "plan": {"digest": digest, "job": job, "shards": total_shards},
        "schema": [{"name": f.name, "type": str(f.type)} for f in schema],
        "image": {"kind": "raw", "shape": [*options.raw, 3]} if options.raw else {"kind": "encoded", "shape": None},
        "shards": [
            {k: records[i][k] for k in ("file", "rows", "bytes", "sha256")} for i in sorted(records)
        ],
        "rows": sum(r["rows"] for r in records.values()),
        "classes": plan.classes,
        "class_counts": counts,
        "source": {"kind": plan.kind, "path": plan.path},
        "options": options.to_json(),
        "source_bytes": sum(r["source_bytes"] for r in records.values()),
        "rejected": len(plan.rejected) + sum(len(r["rejected"]) for r in records.values()),
    }


def ingest(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: IngestOptions = IngestOptions(),  # noqa: B008 - frozen, so a shared default is safe
    *,
    workers: int = 1,
    part: tuple[int, int] = (0, 1),
    progress: bool = False,
    staging: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    retry: Retry | None = None,
) -> dict[str, Any]:
    """Ingest ``source`` into shards in ``out``; returns a summary (counts, sizes, rates).

    Args:
        source: an ImageFolder tree, a CSV/Parquet file list, a Parquet file of image bytes, a ``.tar`` or a folder
            of WebDataset ``.tar`` shards.
        out: the output folder (created); a folder holding an unfinished ingest of the same plan is resumed. Or a
            URL (a ``str``: ``s3://bucket/prefix/``, ``gs://``, ``file://``): shards are written to ``staging`` and
            each is uploaded once complete, the manifest last; a rerun resumes and uploads only what is missing.
        options: what to check and convert.
        workers: processes fetching, checking and converting samples (1: all in this process).
        part: ``(i, N)``: list only the ``i``-th ``1/N`` of the source, write (or upload) its shards,
            ``labels.part-i-of-N.npy`` and ``manifest.part-i-of-N.json``; :func:`~stallfree.ingest.merge.merge`
            joins the parts.
        progress: a progress bar on stderr.
        staging: for a URL ``out``, the local folder shards are written to first; kept at the end. By default a
            folder per URL in the stallfree cache (``$STALLFREE_CACHE_DIR``), removed once the manifest is uploaded.
        storage_options: for a URL ``out``, the fsspec file system's options (credentials, ``endpoint_url``...).
        retry: for a URL ``out``, how each upload is retried.

    Raises:
        ValueError: bad arguments, an unknown source, ``out`` holding a different unfinished ingest, or a URL that
            holds another dataset.
        DiskFull: the disk of ``out`` (or of ``staging``) filled up: the message names the space still needed;
            the shards already written are kept, so the same call resumes after them once there is room.
        FolderLocked: another ingest is writing ``out`` (or this part of it) now; the message names its pid and
            source (:mod:`~stallfree.ingest.lock`).
        RemoteStoreError: an upload's tries were spent (names the shard and the URL).
    """
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    index, count = part
    if not 0 <= index < count:
        raise ValueError(f"--part must be i/N with 0 <= i < N, got {index}/{count}")
    if is_url(source):
        raise ValueError(f"SRC must be a local path, got the URL {redact(str(source))}: download it first")
    target = upload_target(out, part, staging, storage_options, retry)
    folder = target.staging if target else Path(out)
    try:
        with ingest_lock(folder, folder / RECORDS, os.path.abspath(source), part):
            summary = _ingest(source, folder, options, workers, part, progress, target)
    except OSError as err:
        if isinstance(err, DiskFull) or err.errno not in _DISK_FULL:
            raise
        raise DiskFull(f"no space left on device in {folder}, not even for the ingest's lock and plan files; free "
                       "some space (the shards need about the source's size) and run the same command again") from err
    finally:
        if target is not None:
            target.close()
    return summary


def _ingest(source: str | os.PathLike[str], out: Path, options: IngestOptions, workers: int, part: tuple[int, int],
            progress: bool, target: Upload | None) -> dict[str, Any]:
    """:func:`ingest` into the folder ``out`` (a URL's staging folder when ``target`` uploads it)."""
    index, count = part
    started = time.perf_counter()
    plan = plan_source(source, max_sample_bytes=options.max_sample_bytes, part=part)
    bounds = cut(plan.items, options) if plan.items or count == 1 else []  # a part with nothing to list: no shard
    job = job_digest(plan, options, count)
    digest = plan_digest(plan, bounds, job, part)
    names = [shard_name(i, part) for i in range(len(bounds))]  # a part's shards are all its own
    last = [LABELS, REJECTED, MANIFEST] if count == 1 else [part_file(LABELS, part), part_file(MANIFEST, part)]
    records: dict[int, dict[str, Any]] = {}
    try:
        check_plan(out, digest, job, part)
        if target is not None:
            target.begin(digest, MANIFEST if count == 1 else part_file(MANIFEST, part))
        records = resume(out, names, last, part)
        todo = [i for i in range(len(bounds)) if i not in records]
        if target is not None:
            for i in sorted(records):  # written by an earlier run: uploaded unless the store holds them
                target.shard(i, records[i])
        bar = _progress(len(plan.items), progress)
        bar.update(sum(bounds[i][1] - bounds[i][0] for i in records))
        try:
            source_bytes = _write_shards(out, plan, options, bounds, todo, records, names, workers=workers, bar=bar,
                                         started=started, on_shard=target.shard if target else None)
        finally:
            bar.close()
        manifest, rejected = _write_manifest(out, plan, options, digest, job, len(bounds), records, part)
    except OSError as err:
        if err.errno not in _DISK_FULL:
            raise
        raise _disk_full(out, plan, options, bounds, records) from err
    uploaded = target.finish(last) if target is not None else 0
    seconds = time.perf_counter() - started
    written = sum(records[i]["rows"] for i in todo)
    remote = {"url": target.shown, "uploaded_shards": uploaded, "stored_shards": target.present,
              "staging": str(out) if target.keep else None} if target is not None else {}
    return {
        "images": manifest["rows"],
        "rejected": len(rejected),
        "shards": len(records),
        "written_shards": len(todo),
        "resumed_shards": len(records) - len(todo),
        "source_mb": manifest["source_bytes"] / 1e6,
        "shard_mb": sum(r["bytes"] for r in records.values()) / 1e6,
        "seconds": seconds,
        "images_per_s": written / seconds if seconds else 0.0,
        "mb_per_s": source_bytes / 1e6 / seconds if seconds else 0.0,
        "part": f"{index}/{count}",
        **remote,
    }


def _disk_full(out: Path, plan: Plan, options: IngestOptions, bounds: list[tuple[int, int]],
               records: dict[int, dict[str, Any]]) -> DiskFull:
    """The one-line error for a disk that filled up while ``out`` was written (``records``: the shards done)."""
    import shutil

    left = [i for i in range(len(bounds)) if i not in records]
    estimates = sizes(plan.items, options)
    # the shards left, from the estimate that cut them; then labels.npy (8 bytes a row at most) and the manifest
    need = sum(sum(estimates[slice(*bounds[i])]) for i in left) + 8 * len(plan.items) + (1 << 16)
    free = shutil.disk_usage(out).free
    return DiskFull(f"no space left on device in {out}: about {_shown(need)} more are needed for the {len(left)} "
                    f"shard(s) not yet written and the manifest, {_shown(free)} are free; free some space (or quota) "
                    f"and run the same command again, which keeps the {len(records)} shard(s) written")


def _shown(size: int) -> str:
    """``size`` bytes for a person: MB, or kB under 0.1 MB (a nearly full disk has a few kB)."""
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.0f} kB"


def _chunks(bounds: list[tuple[int, int]], todo: list[int]) -> list[tuple[int, int, int]]:
    """``(shard, start, end)`` per unit of work, in order: an empty shard is one empty chunk."""
    chunks = [(i, start, min(start + CHUNK, bounds[i][1])) for i in todo for start in range(*bounds[i], CHUNK)]
    chunks += [(i, bounds[i][0], bounds[i][0]) for i in todo if bounds[i][0] == bounds[i][1]]
    return sorted(chunks)


def _write_shards(out: Path, plan: Plan, options: IngestOptions, bounds: list[tuple[int, int]], todo: list[int],
                  records: dict[int, dict[str, Any]], names: list[str], *, workers: int, bar: Any, started: float,
                  on_shard: Callable[[int, dict[str, Any]], None] | None = None) -> int:
    """Write shards ``todo``, adding their records to ``records``; returns the source bytes read.

    The unit of parallel work is a chunk of a shard, not a shard, so that a dataset of one shard still uses every
    worker; a shard is written by this process as soon as its last chunk is in, then handed to ``on_shard``
    (the upload of an ingest to a URL).
    """
    chunks = _chunks(bounds, todo)
    pieces: dict[int, list[Converted]] = {i: [] for i in todo}
    left = Counter(i for i, _, _ in chunks)
    source_bytes = 0
    with closing(converted(plan, options, chunks, workers)) as pieces_in_order:
        for i, piece in pieces_in_order:
            pieces[i].append(piece)
            bar.update(len(piece[0]["key"]) + len(piece[1]))
            left[i] -= 1
            if left[i]:
                continue
            records[i] = write_shard(out, names[i], pieces.pop(i), options, plan.extra_columns)
            if on_shard is not None:
                on_shard(i, records[i])
            source_bytes += records[i]["source_bytes"]
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(f"{source_bytes / 1e6 / elapsed:.1f} MB/s, {len(records)}/{len(names)} shards")
    return source_bytes


def _write_manifest(out: Path, plan: Plan, options: IngestOptions, digest: str, job: str, total_shards: int,
                    records: dict[int, dict[str, Any]], part: tuple[int, int]) -> tuple[dict[str, Any], list[Any]]:
    """Write the manifest (a part's, with ``--part``), and ``rejected.jsonl`` and ``labels.npy`` for a whole run.

    Returns the manifest and every rejected record of this run or part.
    """
    index, count = part
    manifest = _manifest(plan, options, digest, job, total_shards, records)
    rejected = plan.rejected + [r for i in sorted(records) for r in records[i]["rejected"]]
    if count == 1:
        write_rejected(out, rejected)
        manifest["labels"] = write_labels(out, [s["file"] for s in manifest["shards"]])  # before the manifest
        write_manifest(out / MANIFEST, manifest)
    else:
        manifest["part"] = [index, count]
        # The part's labels, which the merge joins (a merge at a URL could not read the shards' label columns).
        manifest["labels"] = write_labels(out, [s["file"] for s in manifest["shards"]], part_file(LABELS, part))
        # Kept apart so that the merge lists them in a single run's order: the listings', then shard by shard.
        manifest["rejected_listing"] = plan.rejected
        manifest["rejected_by_shard"] = {str(i): records[i]["rejected"] for i in sorted(records)}
        manifest["rejected"] = len(rejected)
        write_manifest(out / part_file(MANIFEST, part), manifest)
    return manifest, rejected
