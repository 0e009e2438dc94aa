"""``stallfree verify`` and ``stallfree info``: re-check an ingested dataset's shards, and summarise it.

Both take a folder or a URL (``s3://``, ``gs://``, ``http(s)://``, ``file://``). At a URL, :func:`info` reads the
manifest alone; :func:`verify` downloads each shard in turn into a temporary folder (with the retries of the
Loader's downloads), checking its size and SHA-256 against the manifest as it arrives, then checks it as a local one.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.ingest.labels import load_labels, parse_labels
from stallfree.ingest.manifest import file_sha256, read_manifest, schema_problem
from stallfree.ingest.remote import (
    Retry,
    is_url,
    open_store,
    read_object,
    redact,
    retried,
)
from stallfree.ingest.token_check import list_problems
from stallfree.ingest.transfer import ChecksumMismatch, download
from stallfree.ingest.validate import Rejected, check_image

__all__ = ["info", "verify"]

#: The kinds whose shards hold token ids (and ``lengths.npy``).
_TEXT_KINDS = ("tokens", "image_text")


def _decode_all(path: Path, raw_shape: list[int] | None) -> list[str]:
    import pyarrow as pa
    import pyarrow.ipc as ipc
    from PIL import Image

    problems = []
    with pa.memory_map(str(path)) as source:
        table = ipc.open_file(source).read_all()
    keys = table.column("key").to_pylist()
    for row, value in enumerate(table.column("image").to_pylist()):
        try:
            if raw_shape is not None:
                if len(value) != raw_shape[0] * raw_shape[1] * raw_shape[2]:
                    raise Rejected(f"{len(value)} bytes, expected {raw_shape}")
                continue
            check_image(value, max_pixels=Image.MAX_IMAGE_PIXELS or 1 << 62, validate=True)
        except Rejected as bad:
            problems.append(f"{path.name} row {row} ({keys[row]}): {bad.reason}")
    return problems


def _check_ids(path: Path, vocab_size: int | None) -> list[str]:
    """Every document of a token shard that the one token check refuses (``--decode`` of token shards)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(str(path)) as source:
        table = ipc.open_file(source).read_all()
    tokens = table.column("tokens").combine_chunks()
    sources = table.column("source")
    return [f"{path.name} row {row} ({sources[row].as_py()}): {reason}"
            for row, reason in list_problems(tokens, vocab_size).items()]


def _decode_images(path: Path) -> list[str]:
    """Every image of an image-text shard that fails to decode (``--decode``); its sample named by its source."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    from PIL import Image

    problems = []
    with pa.memory_map(str(path)) as source:
        table = ipc.open_file(source).read_all()
    sources = table.column("source").to_pylist()
    for row, images in enumerate(table.column("images").to_pylist()):
        for i, value in enumerate(images):
            try:
                check_image(value, max_pixels=Image.MAX_IMAGE_PIXELS or 1 << 62, validate=True)
            except Rejected as bad:
                problems.append(f"{path.name} row {row} ({sources[row]}) image {i}: {bad.reason}")
    return problems


def verify(out: str | os.PathLike[str], *, decode: bool = False, storage_options: dict[str, Any] | None = None,
           retry: Retry | None = None, progress: bool = False) -> list[str]:
    """Every problem found in ``out``'s shards (empty when all is well).

    Checks that each shard exists, has the manifest's size and SHA-256, and opens as an Arrow file with the
    manifest's schema and row count; with ``decode``, decodes every image (of token shards: checks every document
    with the one token check, ``ingest.token_check``). ``labels.npy`` (when the manifest lists it: not in datasets of
    older stallfree) has the manifest's size, SHA-256, dtype and length, and equals the shards' label columns; a token
    folder's ``lengths.npy`` likewise equals the shards' ``length`` columns, and a local image-text folder's
    ``image_counts.npy`` the images of each shard's rows (``--decode``: every image decoded too).

    Args:
        out: an ingested folder, or its URL (a ``str``); a remote shard is named with its URL.
        decode: decode every image too.
        storage_options: for a URL, the fsspec file system's options (credentials, ``endpoint_url``...).
        retry: for a URL, how each download is retried.
        progress: a progress bar (bytes checked) on stderr.

    Raises:
        FileNotFoundError, ValueError: there is no valid manifest.
        RemoteStoreError: the store did not answer.
    """
    retry = retry or Retry()
    remote = is_url(out)
    manifest = read_manifest(out, storage_options, retry)
    problems: list[str] = []
    with _bar(sum(int(s["bytes"]) for s in manifest["shards"]), progress) as bar, \
            tempfile.TemporaryDirectory(prefix="stallfree-verify-") as tmp:
        fetch = _Fetcher(str(out), storage_options or {}, retry, Path(tmp)) if remote else None
        labels = _labels(Path(out), manifest, fetch, problems)
        column, entry = _column_of(manifest)
        first = 0
        for shard in manifest["shards"]:
            seen: list[np.ndarray] = []  # the shard's label column, once read
            if fetch is None:
                problems.extend(_check(Path(out) / shard["file"], shard, manifest, decode, shard["file"], seen))
            else:
                problems.extend(fetch.check(shard, manifest, decode, seen))
            rows = int(shard["rows"])
            ours = labels[first : first + rows] if labels is not None else None
            if ours is not None and seen and len(seen[0]) == rows and not np.array_equal(ours, seen[0]):
                problems.append(f"{manifest[entry]['file']}: rows {first}..{first + rows - 1} differ from "
                                f"{shard['file']}'s {column} column (ingest or --merge again)")
            first += rows
            bar.update(int(shard["bytes"]))
    if manifest.get("kind") == "image_text" and not remote:
        problems.extend(_image_counts(Path(out), manifest))
    return problems


def _image_counts(out: Path, manifest: dict[str, Any]) -> list[str]:
    """How a local image-text folder's ``image_counts.npy`` differs from its file entry or its shards' images."""
    import pyarrow as pa

    from stallfree.ingest.image_text_writer import shard_image_counts

    entry = manifest["image_counts"]
    try:
        counts = load_labels(out, entry, int(manifest["rows"]))
        if file_sha256(out / entry["file"]) != entry["sha256"]:
            return [f"{entry['file']}: SHA-256 differs from the manifest's (the file was altered)"]
    except FileNotFoundError:
        return [f"{entry['file']}: missing"]
    except (OSError, ValueError) as err:
        return [str(err)]
    problems, first = [], 0
    for shard in manifest["shards"]:
        rows = int(shard["rows"])
        try:
            ours = shard_image_counts(out / shard["file"])
        except (pa.ArrowException, OSError, KeyError):  # a shard already reported above
            ours = None
        if ours is not None and len(ours) == rows and not np.array_equal(ours, counts[first : first + rows]):
            problems.append(f"{entry['file']}: rows {first}..{first + rows - 1} differ from {shard['file']}'s "
                            "image counts (ingest again)")
        first += rows
    return problems


def _column_of(manifest: dict[str, Any]) -> tuple[str, str]:
    """The shard column kept again in an array file beside the manifest, and the manifest's entry for that file."""
    return ("length", "lengths") if manifest.get("kind") in _TEXT_KINDS else ("label", "labels")


def _labels(out: Path, manifest: dict[str, Any], fetch: _Fetcher | None, problems: list[str]) -> np.ndarray | None:
    """The dataset's ``labels.npy`` (``lengths.npy`` for tokens) if listed and it checks out; else None (noted)."""
    entry = manifest.get(_column_of(manifest)[1])
    if entry is None:  # ingested by an older stallfree: there is none
        return None
    try:
        if fetch is not None:
            return fetch.labels(entry, int(manifest["rows"]))
        labels = load_labels(out, entry, int(manifest["rows"]))
        if file_sha256(out / entry["file"]) != entry["sha256"]:
            raise OSError(f"{out / entry['file']}: SHA-256 differs from the manifest's (the file was altered)")
        return labels
    except FileNotFoundError:
        problems.append(f"{entry['file']}: missing")
    except (OSError, ValueError) as err:  # ValueError: a store's object larger than the manifest lists
        problems.append(str(err))
    return None


def _bar(total: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, disable=not enabled, dynamic_ncols=True,
                desc="verify")


class _Fetcher:
    """The shards of a dataset at a URL, fetched one at a time into ``tmp`` and checked there."""

    def __init__(self, url: str, storage_options: dict[str, Any], retry: Retry, tmp: Path):
        self.url = url.rstrip("/")
        self.fs, root = open_store(self.url, storage_options, retry.timeout)
        self.root, self.retry, self.tmp = root.rstrip("/"), retry, tmp

    def labels(self, entry: dict[str, Any], rows: int) -> np.ndarray:
        """The dataset's labels file, fetched and checked (raises as :func:`parse_labels` and the fetch do)."""
        url = f"{self.url}/{entry['file']}"
        data = read_object(self.fs, f"{self.root}/{entry['file']}", url, self.retry, limit=int(entry["bytes"]) + 1)
        return parse_labels(data, entry, rows, f"{entry['file']} ({redact(url)})")

    def check(self, shard: dict[str, Any], manifest: dict[str, Any], decode: bool,
              seen: list[np.ndarray]) -> list[str]:
        name = shard["file"]
        url, path = f"{self.url}/{name}", f"{self.root}/{name}"
        where = f"{name} ({redact(url)})"
        try:
            self.fs.invalidate_cache(path)
            size = int(retried(lambda: self.fs.info(path)["size"], redact(url), self.retry))
        except FileNotFoundError:
            return [f"{where}: missing"]
        if size != shard["bytes"]:
            return [f"{where}: {size} bytes, the manifest says {shard['bytes']} (truncated?)"]
        local = self.tmp / name
        try:
            download(self.fs, path, url, local, size, shard["sha256"], self.retry)
        except ChecksumMismatch:
            return [f"{where}: SHA-256 differs from the manifest's (the object was altered)"]
        try:
            return _check(local, shard, manifest, decode, where, seen, hashed=True)
        finally:
            local.unlink(missing_ok=True)


def _check(path: Path, shard: dict[str, Any], manifest: dict[str, Any], decode: bool, where: str,
           seen: list[np.ndarray], hashed: bool = False) -> list[str]:
    """The problems of one shard file at ``path`` (``where`` names it); ``hashed``: its SHA-256 is known to match.

    Its label column goes into ``seen`` once its rows are read (not for an altered or misshapen shard).
    """
    import pyarrow as pa
    import pyarrow.ipc as ipc

    if not path.is_file():
        return [f"{where}: missing"]
    size = path.stat().st_size
    if size != shard["bytes"]:
        return [f"{where}: {size} bytes, the manifest says {shard['bytes']} (truncated?)"]
    problems = []
    altered = not hashed and file_sha256(path) != shard["sha256"]
    if altered:
        problems.append(f"{where}: SHA-256 differs from the manifest's (the file was altered)")
    try:
        with pa.memory_map(str(path)) as source:
            reader = ipc.open_file(source)
            # An altered file still gets its schema compared: a damaged footer is then named by its column.
            schema = schema_problem(reader.schema, manifest["schema"])
            table = None if altered or schema else reader.read_all()
            rows = None if table is None else table.num_rows
            if table is not None:
                seen.append(table.column(_column_of(manifest)[0]).to_numpy())
    except (pa.ArrowException, OSError) as err:
        return [*problems, f"{where}: not a readable Arrow file ({err})"]
    if schema is not None:
        problems.append(f"{where}: {schema} (a damaged footer?)")
    elif rows is None:  # altered: its rows are not worth reading
        pass
    elif rows != shard["rows"]:
        problems.append(f"{where}: {rows} rows, the manifest says {shard['rows']}")
    elif decode and manifest.get("kind") in _TEXT_KINDS:
        problems.extend(_check_ids(path, manifest["vocab_size"]))
        if manifest.get("kind") == "image_text":
            problems.extend(_decode_images(path))
    elif decode:
        problems.extend(_decode_all(path, manifest["image"]["shape"]))
    return problems


def info(out: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A summary of ``out`` (a folder or URL): rows, shards, size, classes with their counts, image kind, source."""
    manifest = read_manifest(out, storage_options)
    if manifest.get("kind") in _TEXT_KINDS:
        keys = ("kind", "rows", "documents", "tokens", "vocab_size", "token_dtype", "source", "tokenizer", "options")
        extra = ("layout", "images", "image_placeholder") if manifest["kind"] == "image_text" else ()
        return {key: manifest.get(key) for key in (*keys, *extra)} | {
            "shards": len(manifest["shards"]),
            "bytes": sum(s["bytes"] for s in manifest["shards"]),
            "rejected": manifest.get("rejected", 0),
            "columns": [c["name"] for c in manifest["schema"]],
        }
    return {
        "rows": manifest["rows"],
        "shards": len(manifest["shards"]),
        "bytes": sum(s["bytes"] for s in manifest["shards"]),
        "source_bytes": manifest.get("source_bytes"),
        "rejected": manifest.get("rejected", 0),
        "image": manifest["image"],
        "classes": dict(zip(manifest["classes"], manifest.get("class_counts", []), strict=False)),
        "columns": [c["name"] for c in manifest["schema"]],
        "source": manifest.get("source"),
        "options": manifest.get("options"),
    }
