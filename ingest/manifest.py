"""The manifest of an ingested dataset: ``manifest.json`` beside its ``shard-NNNNN.arrow`` files.

It is the only thing a reader needs besides the shards: format version, schema, rows and a SHA-256 per shard, class
names and counts, the source and the ingest options; and the name, size, SHA-256 and dtype of ``labels.npy``, every
row's label in one array (:mod:`stallfree.ingest.labels`; absent from manifests of older stallfree). It is written
last, through a temporary name, so a folder with a ``manifest.json`` is a complete dataset. JSON only (nothing is
ever unpickled). It holds no time stamps and no output path, so an interrupted and resumed ingest writes the same
bytes as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from stallfree.ingest.atomic import atomic_write
from stallfree.ingest.remote import Retry, is_url, open_store, read_object, redact

__all__ = [
    "FORMAT",
    "LABELS",
    "MANIFEST",
    "REJECTED",
    "VERSION",
    "file_sha256",
    "parse_manifest",
    "read_manifest",
    "schema_problem",
    "part_file",
    "shard_name",
    "write_manifest",
    "write_rejected",
]

FORMAT = "stallfree-shards"
VERSION = 1
MANIFEST = "manifest.json"
REJECTED = "rejected.jsonl"  # one JSON record per sample the ingest rejected, beside the manifest
LABELS = "labels.npy"  # every row's label, one array (stallfree.ingest.labels); listed under the manifest's "labels"


def part_file(name: str, part: tuple[int, int]) -> str:
    """What part ``(i, N)`` of a split ingest calls its ``name``: ``manifest.json`` -> ``manifest.part-i-of-N.json``."""
    stem, dot, suffix = name.rpartition(".")
    return f"{stem}.part-{part[0]}-of-{part[1]}{dot}{suffix}"


def shard_name(index: int, part: tuple[int, int] = (0, 1)) -> str:
    """The file name of shard ``index`` (of part ``(i, N)`` of a split ingest, which numbers its shards from 0)."""
    if part[1] == 1:
        return f"shard-{index:05d}.arrow"
    width = len(str(part[1] - 1))
    return f"shard-{part[0]:0{width}d}-of-{part[1]}-{index:05d}.arrow"


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """The hex SHA-256 of a file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write a manifest (sorted keys, indented, newline-terminated) atomically."""
    atomic_write(path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())


def read_manifest(folder: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
                  retry: Retry | None = None) -> dict[str, Any]:
    """Read and check ``folder/manifest.json``; ``folder`` may be a URL (a ``str``: ``s3://``, ``https://``...).

    Args:
        folder: an ingested folder or its URL.
        storage_options: for a URL, the fsspec file system's options (credentials, ``endpoint_url``...).
        retry: for a URL, how the read is retried.

    Raises:
        FileNotFoundError: there is no manifest (the ingest has not finished, or this is not an ingested folder).
        ValueError: it is not valid JSON, not a stallfree manifest, or of a newer format version.
        RemoteStoreError: the store did not answer.
    """
    if is_url(folder):
        return _read_remote(str(folder), storage_options or {}, retry or Retry())
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: not an ingested dataset, or its ingest has not finished (run it again to resume)"
        )
    return parse_manifest(path.read_bytes(), str(path))


def _read_remote(url: str, storage_options: dict[str, Any], retry: Retry) -> dict[str, Any]:
    url = url.rstrip("/")
    url = url[: -len(MANIFEST) - 1] if url.endswith("/" + MANIFEST) else url
    fs, root = open_store(url, storage_options, retry.timeout)
    where = f"{redact(url)}/{MANIFEST}"
    try:
        data = read_object(fs, f"{root.rstrip('/')}/{MANIFEST}", f"{url}/{MANIFEST}", retry)
    except FileNotFoundError:
        raise FileNotFoundError(f"{where} does not exist: not an ingested dataset, or its ingest (upload) has not "
                                "finished") from None
    return parse_manifest(data, where)


def parse_manifest(data: bytes, where: str) -> dict[str, Any]:
    """Check a manifest's bytes (read from ``where``, a path or URL for messages) and return it.

    Raises:
        ValueError: it is not valid JSON, not a stallfree manifest, or of a newer format version.
    """
    try:
        manifest = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where} is not valid JSON: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{where} is not a {FORMAT} manifest")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise ValueError(f"{where} has format version {manifest.get('version')!r}; this stallfree reads <= {VERSION}")
    for key in ("shards", "classes", "schema", "image", "rows"):
        if key not in manifest:
            raise ValueError(f"{where} lacks the {key!r} entry")
    return manifest


def schema_problem(schema: Any, expected: list[dict[str, str]]) -> str | None:
    """How a shard's Arrow ``schema`` differs from the manifest's ``expected`` ``[{"name", "type"}]``, or None.

    A damaged footer can rename or retype a field while the file still parses; every reader of a shard compares
    the schema when it opens one, so that the damage is reported by field and file, not met later as a lookup error.
    """
    found = {field.name: str(field.type) for field in schema}
    for column in expected:
        name, kind = column["name"], column["type"]
        if name not in found:
            return f"lacks the column {name!r} ({kind}) that the manifest lists; its columns are {list(found)}"
        if found[name] != kind:
            return f"has column {name!r} of type {found[name]}, the manifest says {kind}"
    extra = [name for name in found if name not in {c["name"] for c in expected}]
    if extra:
        return f"has column(s) {extra} that the manifest does not list"
    return None


def write_rejected(out: Path, rejected: list[dict[str, str]]) -> None:
    """Write ``out/rejected.jsonl``: one sorted-key JSON record per line, atomically."""
    atomic_write(out / REJECTED, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rejected).encode())
