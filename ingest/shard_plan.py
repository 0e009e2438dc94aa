"""How a source is cut into shards, and the record of that cut which lets a rerun, or a part, resume.

The cut is decided from the listing alone (sample sizes from the file system, the tar index or Parquet metadata),
so every run, resumed or not, numbers the same samples into the same shards. Its digest goes into
``.ingest/plan.json`` (``plan.part-I-of-N.json`` for a part), with the digest of what every part of one split
ingest shares: a rerun into a folder that holds another plan is refused, and one of the same plan keeps every
shard whose record says it is complete.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from stallfree.core.atomic import atomic_write, remove_temporaries
from stallfree.ingest.manifest import MANIFEST
from stallfree.ingest.sources import Item, Plan
from stallfree.ingest.writer import RECORDS, IngestOptions, record_path

__all__ = ["check_plan", "cut", "job_digest", "plan_digest", "plan_name", "resume", "sizes"]


def sizes(items: list[Item], options: IngestOptions) -> list[int]:
    """Each item's estimated size in a shard: its source bytes, or ``height * width * 3`` with ``raw``."""
    if options.raw:
        return [options.raw[0] * options.raw[1] * 3] * len(items)
    return [item.size for item in items]


def cut(items: list[Item], options: IngestOptions) -> list[tuple[int, int]]:
    """Shard boundaries ``[(start, end), ...]`` over ``items``, each about ``shard_mb`` of (estimated) bytes."""
    target = options.shard_mb * 1e6
    bounds, start, size = [], 0, 0.0
    for i, item_size in enumerate(sizes(items, options)):
        size += item_size
        if size >= target:
            bounds.append((start, i + 1))
            start, size = i + 1, 0.0
    if start < len(items) or not bounds:
        bounds.append((start, len(items)))
    return bounds


def job_digest(plan: Plan, options: IngestOptions, count: int) -> str:
    """What every part of one split ingest shares: the source's kind, classes and units, the options and ``N``.

    Not the source's absolute path: the parts of one job may see the same data mounted at different places. Not a
    tar folder's classes: they are ``0..`` the largest label a part's own tars hold.
    """
    classes = None if plan.kind == "webdataset" else plan.classes
    shared = [plan.kind, classes, plan.units, plan.extra_columns, options.to_json(), count]
    return hashlib.sha256(json.dumps(shared).encode()).hexdigest()


def plan_digest(plan: Plan, bounds: list[tuple[int, int]], job: str, part: tuple[int, int]) -> str:
    """This run's (or part's) plan: the job, and every sample it lists and where its shards are cut."""
    digest = hashlib.sha256()
    digest.update(json.dumps([job, list(part), plan.classes, bounds, plan.rejected]).encode())
    for item in plan.items:
        digest.update(f"\0{item.key}\0{item.label}\0{item.size}".encode())
    return digest.hexdigest()


def plan_name(part: tuple[int, int]) -> str:
    """The file, in ``.ingest``, holding the plan of a run (or of part ``(i, N)``)."""
    return "plan.json" if part[1] == 1 else f"plan.part-{part[0]}-of-{part[1]}.json"


def check_plan(out: Path, digest: str, job: str, part: tuple[int, int]) -> None:
    """Record this run's plan in ``out``, or refuse an ``out`` that holds an unfinished ingest of another plan.

    Another part's plan file is left alone, but one of another job (source, options or split) is refused here, not
    at the merge.
    """
    name = plan_name(part)
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


def resume(out: Path, names: list[str], last: list[str], part: tuple[int, int]) -> dict[int, dict[str, Any]]:
    """The records, by shard index, of the shard files ``names`` already complete in ``out``.

    The temporary files an earlier run of this part left when it was killed mid-write (its shards', records',
    plan's and ``last`` files', whichever host and process wrote them) are removed first: this run holds the part's
    lock, so no writer of them is alive. Another part's are left alone: it may be writing them now.
    """
    remove_temporaries(out, {*names, *last})
    remove_temporaries(out / RECORDS, {*(record_path(out, name).name for name in names), plan_name(part)})
    records: dict[int, dict[str, Any]] = {}
    for i, name in enumerate(names):
        record = _done(out, name)
        if record is not None:
            records[i] = record
    return records
