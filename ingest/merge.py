"""``stallfree ingest --merge``: join the ``manifest.part-I-of-N.json`` files of an ingest split with ``--part``.

Each part listed and cut its own contiguous share of the source, so the merged manifest lists part 0's shards, then
part 1's, and so on: the samples in the order a one-part ingest has them. The labels come from the parts'
``labels.part-I-of-N.npy``, so a merge reads no shard: the parts may be in a local folder or at a URL (``s3://``,
``gs://``, ``file://``), where ``labels.npy`` and ``rejected.jsonl`` are uploaded first and ``manifest.json`` last.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.ingest.labels import check_labels, save_labels
from stallfree.ingest.lock import ingest_lock
from stallfree.ingest.manifest import LABELS, MANIFEST, REJECTED, parse_manifest, write_manifest, write_rejected
from stallfree.ingest.remote import Retry, is_url, list_objects, open_store, read_object, redact
from stallfree.ingest.transfer import upload
from stallfree.ingest.writer import RECORDS

__all__ = ["merge"]

_PART = re.compile(r"manifest\.part-(\d+)-of-(\d+)\.json")


def merge(out: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
          retry: Retry | None = None) -> dict[str, Any]:
    """Join ``out``'s ``manifest.part-I-of-N.json`` files into ``manifest.json``, ``labels.npy``, ``rejected.jsonl``.

    ``out`` is a folder holding every part's files, or their URL (a ``str``).

    Args:
        out: the parts' folder or URL.
        storage_options: for a URL, the fsspec file system's options (credentials, ``endpoint_url``...).
        retry: for a URL, how each read and upload is retried.

    Raises:
        FileNotFoundError: no part manifest.
        FolderLocked: an ingest (a part) is writing the folder now (named).
        ValueError: parts are missing, come from different sources or options, or a part's shard or labels file is
            absent or not what its manifest says.
        RemoteStoreError: the store did not answer.
    """
    if is_url(out):
        return _merge_at(str(out), storage_options or {}, retry or Retry())
    if storage_options is not None or retry is not None:
        raise ValueError(f"storage_options= and retry= apply to parts at a URL, but OUT is {str(out)!r}; drop them")
    folder = Path(out)

    def read(name: str) -> bytes:
        return (folder / name).read_bytes()

    # no part may be writing while the parts are merged (a missing folder is refused by _join, as one without parts)
    locked = ingest_lock(folder, folder / RECORDS, "--merge", None) if folder.is_dir() else contextlib.nullcontext()
    with locked:
        sizes = {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()} if folder.is_dir() else {}
        manifest, rejected, labels, parts = _join(str(folder), sizes, read)
        write_rejected(folder, rejected)
        manifest["labels"] = save_labels(folder, labels)  # before the manifest names it
        write_manifest(folder / MANIFEST, manifest)
    return _summary(manifest, rejected, parts)


def _merge_at(url: str, storage_options: dict[str, Any], retry: Retry) -> dict[str, Any]:
    """:func:`merge` of parts at ``url``: written in a temporary folder, then uploaded, the manifest last."""
    url = url.rstrip("/")
    fs, root = open_store(url, storage_options, retry.timeout)
    root = root.rstrip("/")
    sizes = {name: int(info.get("size") or 0) for name, info in list_objects(fs, root, url, retry).items()}

    def read(name: str) -> bytes:
        return read_object(fs, f"{root}/{name}", f"{url}/{name}", retry)

    manifest, rejected, labels, parts = _join(redact(url), sizes, read)
    with tempfile.TemporaryDirectory(prefix="stallfree-merge-") as tmp:
        local = Path(tmp)
        write_rejected(local, rejected)
        manifest["labels"] = save_labels(local, labels)
        write_manifest(local / MANIFEST, manifest)
        for name in (LABELS, REJECTED, MANIFEST):  # the manifest last: a reader that finds it finds the rest
            upload(fs, local / name, f"{root}/{name}", f"{url}/{name}", retry)
    return _summary(manifest, rejected, parts)


def _join(where: str, sizes: dict[str, int],
          read: Callable[[str], bytes]) -> tuple[dict[str, Any], list[dict[str, str]], np.ndarray, int]:
    """The merged manifest (without its labels entry), every rejected record, every row's label, the part count.

    ``sizes``: the files at ``where`` (name -> bytes); ``read(name)``: one file's bytes.
    """
    names = sorted(name for name in sizes if _PART.fullmatch(name))
    if not names:
        raise FileNotFoundError(f"no manifest.part-I-of-N.json in {where}: run `stallfree ingest ... --part i/N` "
                                "first")
    manifests = sorted((parse_manifest(read(name), f"{where}/{name}") for name in names),
                       key=lambda m: m["part"][0])
    count = manifests[0]["part"][1]
    found = [m["part"][0] for m in manifests]
    if any(m["part"][1] != count for m in manifests) or found != list(range(count)):
        raise ValueError(f"{where}: expected parts 0..{count - 1} of {count}, found {names}")
    jobs = {m["plan"].get("job") for m in manifests}
    if None in jobs or any("labels" not in m for m in manifests):
        raise ValueError(f"{where}: a part manifest was written by an earlier stallfree (no plan.job or labels); "
                         "ingest its parts again")
    if len(jobs) != 1:
        raise ValueError(f"{where}: the parts come from different sources or options (jobs {sorted(jobs)})")
    merged = {k: v for k, v in manifests[0].items() if k not in ("part", "rejected_listing", "rejected_by_shard")}
    merged["shards"] = [s for m in manifests for s in m["shards"]]
    for shard in merged["shards"]:
        if sizes.get(shard["file"]) != shard["bytes"]:
            state = "missing" if shard["file"] not in sizes else f"{sizes[shard['file']]} bytes, not {shard['bytes']}"
            raise ValueError(f"{where}: {shard['file']} is listed by a part but {state}; copy (or upload) every "
                             "part's shards there")
    digest = hashlib.sha256("".join(m["plan"]["digest"] for m in manifests).encode()).hexdigest()
    merged["plan"] = {"digest": digest, "job": jobs.pop(), "shards": len(merged["shards"])}
    merged["classes"] = max((m["classes"] for m in manifests), key=len)  # a tar folder's: 0.. the largest label
    if any(m["classes"] != merged["classes"][: len(m["classes"])] for m in manifests):
        raise ValueError(f"{where}: the parts name different classes")
    for key in ("rows", "source_bytes"):
        merged[key] = sum(m[key] for m in manifests)
    merged["class_counts"] = [sum(m["class_counts"][c] for m in manifests if c < len(m["class_counts"]))
                              for c in range(len(merged["classes"]))]
    rejected = [r for m in manifests for r in m["rejected_listing"]]
    for m in manifests:
        rejected += [r for i in sorted(m["rejected_by_shard"], key=int) for r in m["rejected_by_shard"][i]]
    merged["rejected"] = len(rejected)
    labels = [_part_labels(m, where, read) for m in manifests]
    return merged, rejected, np.concatenate(labels) if labels else np.empty(0, np.int8), count


def _part_labels(manifest: dict[str, Any], where: str, read: Callable[[str], bytes]) -> np.ndarray:
    """A part's ``labels.part-I-of-N.npy``, checked against its manifest's entry (SHA-256, dtype, rows)."""
    entry = manifest["labels"]
    shown = f"{where}/{entry['file']}"
    try:
        data = read(entry["file"])
    except FileNotFoundError:
        raise ValueError(f"{shown} is listed by its part but missing; copy (or upload) every part's files") from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ValueError(f"{shown}: its SHA-256 differs from its part manifest's (damaged, or from another run)")
    labels = np.load(io.BytesIO(data), allow_pickle=False)
    problem = check_labels(labels, entry, manifest["rows"], shown)
    if problem is not None:
        raise ValueError(problem)
    return np.asarray(labels)


def _summary(manifest: dict[str, Any], rejected: list[dict[str, str]], parts: int) -> dict[str, Any]:
    return {"images": manifest["rows"], "rejected": len(rejected), "shards": len(manifest["shards"]), "parts": parts}
