"""``stallfree ingest --merge``: join the ``manifest.part-I-of-N.json`` files of an ingest split with ``--part``."""

from __future__ import annotations

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
        ValueError: parts are missing, come from different plans, or a part's shard file is absent.
    """
    if is_url(out):
        raise ValueError(f"--merge of a dataset at a URL ({redact(str(out))}) is not supported: merge the parts in a "
                         "local folder, then upload it")
    out = Path(out)
    parts = sorted(out.glob("manifest.part-*-of-*.json"))
    if not parts:
        raise FileNotFoundError(f"no manifest.part-I-of-N.json in {out}: run `stallfree ingest ... --part i/N` first")
    manifests = [json.loads(p.read_text()) for p in parts]
    count = manifests[0]["part"][1]
    found = sorted(m["part"][0] for m in manifests)
    if any(m["part"][1] != count for m in manifests) or found != list(range(count)):
        raise ValueError(f"{out}: expected parts 0..{count - 1} of {count}, found {[p.name for p in parts]}")
    digests = {m["plan"]["digest"] for m in manifests}
    if len(digests) != 1:
        raise ValueError(f"{out}: the parts come from different sources or options (plans {sorted(digests)})")
    merged = {k: v for k, v in manifests[0].items() if k not in ("part", "rejected_listing", "rejected_by_shard")}
    merged["shards"] = sorted((s for m in manifests for s in m["shards"]), key=lambda s: s["file"])
    for shard in merged["shards"]:
        if not (out / shard["file"]).is_file():
            raise ValueError(f"{out}: {shard['file']} is listed by a part but missing; copy every part's shards here")
    for key in ("rows", "source_bytes"):
        merged[key] = sum(m[key] for m in manifests)
    merged["class_counts"] = [sum(c) for c in zip(*(m["class_counts"] for m in manifests), strict=True)]
    by_shard = {int(i): r for m in manifests for i, r in m["rejected_by_shard"].items()}
    rejected = [r for m in manifests for r in m["rejected_listing"]]
    rejected += [r for i in sorted(by_shard) for r in by_shard[i]]
    merged["rejected"] = len(rejected)
    write_rejected(out, rejected)
    merged["labels"] = write_labels(out, [s["file"] for s in merged["shards"]])  # before the manifest names it
    write_manifest(out / MANIFEST, merged)
    read_manifest(out)
    return {"images": merged["rows"], "rejected": len(rejected), "shards": len(merged["shards"]), "parts": count}
