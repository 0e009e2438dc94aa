"""``stallfree ingest --merge``: join the ``manifest.part-I-of-N.json`` files of an ingest split with ``--part``.

Each part listed and cut its own contiguous share of the source, so the merged manifest lists part 0's shards, then
part 1's, and so on: the samples in the order a one-part ingest has them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from stallfree.ingest.labels import write_labels
from stallfree.ingest.manifest import MANIFEST, read_manifest, write_manifest, write_rejected
from stallfree.ingest.remote import is_url, redact

__all__ = ["merge"]


def merge(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Join ``out``'s ``manifest.part-I-of-N.json`` files (every part's shards copied into ``out``) into one.

    Raises:
        ValueError: parts are missing, come from different sources or options, or a part's shard file is absent.
    """
    if is_url(out):
        raise ValueError(f"--merge of a dataset at a URL ({redact(str(out))}) is not supported: merge the parts in a "
                         "local folder, then upload it")
    out = Path(out)
    parts = sorted(out.glob("manifest.part-*-of-*.json"))
    if not parts:
        raise FileNotFoundError(f"no manifest.part-I-of-N.json in {out}: run `stallfree ingest ... --part i/N` first")
    manifests = sorted((json.loads(p.read_text()) for p in parts), key=lambda m: m["part"][0])
    count = manifests[0]["part"][1]
    found = [m["part"][0] for m in manifests]
    if any(m["part"][1] != count for m in manifests) or found != list(range(count)):
        raise ValueError(f"{out}: expected parts 0..{count - 1} of {count}, found {[p.name for p in parts]}")
    jobs = {m["plan"].get("job") for m in manifests}
    if None in jobs:
        raise ValueError(f"{out}: a part manifest was written by an earlier stallfree (no plan.job); ingest its parts "
                         "again")
    if len(jobs) != 1:
        raise ValueError(f"{out}: the parts come from different sources or options (jobs {sorted(jobs)})")
    merged = {k: v for k, v in manifests[0].items() if k not in ("part", "rejected_listing", "rejected_by_shard")}
    merged["shards"] = [s for m in manifests for s in m["shards"]]
    digest = hashlib.sha256("".join(m["plan"]["digest"] for m in manifests).encode()).hexdigest()
    merged["plan"] = {"digest": digest, "job": jobs.pop(), "shards": len(merged["shards"])}
    merged["classes"] = max((m["classes"] for m in manifests), key=len)  # a tar folder's: 0.. the largest label
    if any(m["classes"] != merged["classes"][:len(m["classes"])] for m in manifests):
        raise ValueError(f"{out}: the parts name different classes")
    for shard in merged["shards"]:
        if not (out / shard["file"]).is_file():
            raise ValueError(f"{out}: {shard['file']} is listed by a part but missing; copy every part's shards here")
    for key in ("rows", "source_bytes"):
        merged[key] = sum(m[key] for m in manifests)
    merged["class_counts"] = [sum(m["class_counts"][c] for m in manifests if c < len(m["class_counts"]))
                              for c in range(len(merged["classes"]))]
    rejected = [r for m in manifests for r in m["rejected_listing"]]
    for m in manifests:
        rejected += [r for i in sorted(m["rejected_by_shard"], key=int) for r in m["rejected_by_shard"][i]]
    merged["rejected"] = len(rejected)
    write_rejected(out, rejected)
    merged["labels"] = write_labels(out, [s["file"] for s in merged["shards"]])  # before the manifest names it
    write_manifest(out / MANIFEST, merged)
    read_manifest(out)
    return {"images": merged["rows"], "rejected": len(rejected), "shards": len(merged["shards"]), "parts": count}
