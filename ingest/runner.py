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
import hashlib
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from stallfree.core.atomic import atomic_write, remove_temporaries
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
from stallfree.ingest.sources import Item, Plan, plan_source
from stallfree.ingest.upload import Upload, upload_target
from stallfree.ingest.workers import converted
from stallfree.ingest.writer import RECORDS, Converted, IngestOptions, _schema, record_path, write_shard

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


def _sizes(items: list[Item], options: IngestOptions) -> list[int]:
    """Each item's estimated size in a shard: its source bytes, or ``height * width * 3`` with ``raw``."""
    if options.raw:
        return [options.raw[0] * options.raw[1] * 3] * len(items)
    return [item.size for item in items]


def _cut(items: list[Item], options: IngestOptions) -> list[tuple[int, int]]:
    """Shard boundaries ``[(start, end), ...]`` over ``items``, each about ``shard_mb`` of (estimated) bytes."""
    target = options.shard_mb * 1e6
    bounds, start, size = [], 0, 0.0
    for i, item_size in enumerate(_sizes(items, options)):
        size += item_size
        if size >= target:
            bounds.append((start, i + 1))
            start, size = i + 1, 0.0
    if start < len(items) or not bounds:
        bounds.append((start, len(items)))
    return bounds


def _job(plan: Plan, options: IngestOptions, count: int) -> str:
    """What every part of one split ingest shares: the source's kind, classes and units, the options and ``N``.

    Not the source's absolute path: the parts of one job may see the same data mounted at different places. Not a
    tar folder's classes: they are ``0..`` the largest label a part's own tars hold.
    """
    classes = None if plan.kind == "webdataset" else plan.classes
    shared = [plan.kind, classes, plan.units, plan.extra_columns, options.to_json(), count]
    return hashlib.sha256(json.dumps(shared).encode()).hexdigest()


def _digest(plan: Plan, bounds: list[tuple[int, int]], job: str, part: tuple[int, int]) -> str:
    """This run's (or part's) plan: the job, and every sample it lists and where its shards are cut."""
    digest = hashlib.sha256()
    digest.update(json.dumps([job, list(part), plan.classes, bounds, plan.rejected]).encode())
    for item in plan.items:
        digest.update(f"\0{item.key}\0{item.label}\0{item.size}".encode())
    return digest.hexdigest()


def _plan_name(part: tuple[int, int]) -> str:
    """The file, in ``.ingest``, holding the plan of a run (or of part ``(i, N)``)."""
    return "plan.json" if part[1] == 1 else f"plan.part-{part[0]}-of-{part[1]}.json"


def _check_plan(out: Path, digest: str, job: str, part: tuple[int, int]) -> None:
    """Record this run's plan in ``out``, or refuse an ``out`` that holds an unfinished ingest of another plan.

    Another part's plan file is left alone, but one of another job (source, options or split) is refused here, not
    at the merge.
    """
    name = _plan_name(part)
    count = part[1]
    records = out / RECORDS
    for other in sorted(records.glob("plan*.json")) if records.is_dir() else []:
        previous = json.loads(other.read_text())
        split = previous.get("part", [0, 1])[1]
        if other.name != name and split != count:
            raise ValueError(
                f"{out} holds an unfinished ingest split {split} way(s) ({other.name}), not {count}; pass an empty OUT "
                f"folder, or delete {out} to start over"
            )
        if (previous.get("digest") != digest) if other.name == name else (previous.get("job") != job):
            state = "a finished" if (out / MANIFEST).is_file() else "an unfinished"
            raise ValueError(
                f"{out} holds {state} ingest of a different source or options (plan "
                f"{str(previous.get('digest'))[:12]} != {digest[:12]}); pass an empty OUT folder, or delete {out} to "
                "start over"
            )
    path = records / name
    if not path.is_file():
        records.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"digest": digest, "job": job, "part": list(part)}).encode())


def _done(out: Path, name: str) -> dict[str, Any] | None:
    """The record of the shard file ``name`` if the shard is complete, else None (it is written again)."""
    path = record_path(out, name)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    shard = out / name
    return record if shard.is_file() and shard.stat().st_size == record["bytes"] else None


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
    bounds = _cut(plan.items, options) if plan.items or count == 1 else []  # a part with nothing to list: no shard
    job = _job(plan, options, count)
    digest = _digest(plan, bounds, job, part)
    names = [shard_name(i, part) for i in range(len(bounds))]  # a part's shards are all its own
    last = [LABELS, REJECTED, MANIFEST] if count == 1 else [part_file(LABELS, part), part_file(MANIFEST, part)]
    records: dict[int, dict[str, Any]] = {}
    try:
        _check_plan(out, digest, job, part)
        if target is not None:
            target.begin(digest, MANIFEST if count == 1 else part_file(MANIFEST, part))
        records = _resume(out, names, last, part)
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


def _resume(out: Path, names: list[str], last: list[str], part: tuple[int, int]) -> dict[int, dict[str, Any]]:
    """The records, by shard index, of the shard files ``names`` already complete in ``out``.

    The temporary files an earlier run of this part left when it was killed mid-write (its shards', records',
    plan's and ``last`` files', whichever host and process wrote them) are removed first: this run holds the part's
    lock, so no writer of them is alive. Another part's are left alone: it may be writing them now.
    """
    remove_temporaries(out, {*names, *last})
    remove_temporaries(out / RECORDS, {*(record_path(out, name).name for name in names), _plan_name(part)})
    records: dict[int, dict[str, Any]] = {}
    for i, name in enumerate(names):
        record = _done(out, name)
        if record is not None:
            records[i] = record
    return records


def _disk_full(out: Path, plan: Plan, options: IngestOptions, bounds: list[tuple[int, int]],
               records: dict[int, dict[str, Any]]) -> DiskFull:
    """The one-line error for a disk that filled up while ``out`` was written (``records``: the shards done)."""
    import shutil

    left = [i for i in range(len(bounds)) if i not in records]
    sizes = _sizes(plan.items, options)
    # the shards left, from the estimate that cut them; then labels.npy (8 bytes a row at most) and the manifest
    need = sum(sum(sizes[slice(*bounds[i])]) for i in left) + 8 * len(plan.items) + (1 << 16)
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
