"""The manifest of an ingested dataset: ``manifest.json`` beside its ``shard-NNNNN.arrow`` files.

It is the only thing a reader needs besides the shards: format version, schema, rows and a SHA-256 per shard, class
names and counts, the source and the ingest options; and the name, size, SHA-256 and dtype of ``labels.npy``, every
row's label in one array (:mod:`stallfree.ingest.labels`; absent from manifests of older stallfree). It is written
last, through a temporary name, so a folder with a ``manifest.json`` is a complete dataset. JSON only (nothing is
ever unpickled). It holds no time stamps and no output path, so an interrupted and resumed ingest writes the same
bytes as an uninterrupted one.

A manifest of token shards (:mod:`~stallfree.ingest.token_writer`) says ``"kind": "tokens"`` (an image manifest has
no kind), and holds ``vocab_size``, ``token_dtype``, ``documents``, ``tokens`` and ``lengths`` (``lengths.npy``'s
entry) in place of the image entry; one of image-text shards (:mod:`~stallfree.ingest.image_text_writer`) says
``"kind": "image_text"`` and holds a token manifest's fields plus ``layout``, ``images``, ``image_placeholder`` and
``image_counts`` (``image_counts.npy``'s entry). :func:`parse_manifest` checks each kind's own fields.

A manifest read is not trusted, wherever it comes from (a folder, a URL, a part of a split ingest, ``stallfree
verify``): :func:`parse_manifest` is the one place that checks it. It reads at most :data:`MANIFEST_LIMIT` bytes
(from a store, within ``remote_timeout`` seconds), parses it, and checks its whole schema (every field's type, the
shards' rows adding up to the total, file names that stay inside the dataset's folder) before any reader uses it,
so a hostile or damaged manifest is a ``ValueError`` naming ``manifest.json`` and the field, never a ``TypeError``,
a ``KeyError`` or a file outside the dataset.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, TypeGuard

from stallfree.core.atomic import atomic_write
from stallfree.ingest.remote import Retry, is_url, open_store, read_object, redact

__all__ = [
    "FORMAT",
    "KINDS",
    "LABELS",
    "MANIFEST",
    "MANIFEST_LIMIT",
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
#: What the shards hold: images (a manifest without ``"kind"``), token sequences (:mod:`.token_writer`), or
#: image-text samples (:mod:`.image_text_writer`).
KINDS = ("images", "tokens", "image_text")
REJECTED = "rejected.jsonl"  # one JSON record per sample the ingest rejected, beside the manifest
LABELS = "labels.npy"  # every row's label, one array (stallfree.ingest.labels); listed under the manifest's "labels"
#: The most bytes of a manifest read: about 200,000 shards' entries (ImageNet's 1.28 million images are 640 shards of
#: 256 MB, a 100-million-image dataset about 8 MB of manifest). Parsed JSON costs several times its size in memory.
MANIFEST_LIMIT = 32 << 20
#: A file the manifest lists: a plain name in the dataset's folder (no separator, no ``..``, no hidden name).
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


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
        ValueError: it is larger than :data:`MANIFEST_LIMIT`, not valid JSON, not a stallfree manifest, of a newer
            format version, or a field is missing or wrong (named).
        RemoteStoreError: the store did not answer, or did not send the manifest within ``retry.timeout`` seconds.
    """
    if is_url(folder):
        return _read_remote(str(folder), storage_options or {}, retry or Retry())
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: not an ingested dataset, or its ingest has not finished (run it again to resume)"
        )
    with open(path, "rb") as f:
        # No more than the limit (a larger one is refused by parse_manifest), and no larger a buffer than the file.
        data = f.read(min(os.fstat(f.fileno()).st_size, MANIFEST_LIMIT) + 1)
    return parse_manifest(data, str(path))


def _read_remote(url: str, storage_options: dict[str, Any], retry: Retry) -> dict[str, Any]:
    url = url.rstrip("/")
    url = url[: -len(MANIFEST) - 1] if url.endswith("/" + MANIFEST) else url
    fs, root = open_store(url, storage_options, retry.timeout)
    where = f"{redact(url)}/{MANIFEST}"
    try:
        # bounded in bytes and in time: a hostile store could send an endless manifest, or one byte a second
        data = read_object(fs, f"{root.rstrip('/')}/{MANIFEST}", f"{url}/{MANIFEST}", retry, limit=MANIFEST_LIMIT,
                           deadline=retry.timeout)
    except FileNotFoundError:
        raise FileNotFoundError(f"{where} does not exist: not an ingested dataset, or its ingest (upload) has not "
                                "finished") from None
    return parse_manifest(data, where)


def parse_manifest(data: bytes, where: str) -> dict[str, Any]:
    """Check a manifest's bytes (read from ``where``, a path or URL for messages) and return it.

    Raises:
        ValueError: larger than :data:`MANIFEST_LIMIT`, not valid JSON, not a stallfree manifest, of a newer format
            version, or a field that is missing or of the wrong type or value: the message names ``where`` and the
            field (``shards[3].file``).
    """
    if len(data) > MANIFEST_LIMIT:
        raise ValueError(f"{where} is larger than {MANIFEST_LIMIT} bytes, the most a manifest may have (about 200,000 "
                         "shards); it is not a stallfree manifest")
    try:
        manifest = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{where} is not valid JSON: {err}") from None
    except RecursionError:
        raise ValueError(f"{where} is not a stallfree manifest: its JSON is nested too deeply") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{where} is not a {FORMAT} manifest")
    version = manifest.get("version")
    if not _is_count(version) or not 1 <= version <= VERSION:
        raise ValueError(f"{where} has format version {_show(version)}; this stallfree reads 1 to {VERSION}")
    _check_fields(manifest, where)
    return manifest


def _check_fields(manifest: dict[str, Any], where: str) -> None:
    """Every field a reader uses, with its type and value; a ``ValueError`` naming the first one that is wrong."""

    def need(ok: bool, field: str, wanted: str, value: Any) -> None:
        if not ok:
            raise ValueError(f"{where}: {field} must be {wanted}, got {_show(value)}")

    kind = manifest.get("kind", "images")
    need(kind in KINDS, "kind", f"one of {list(KINDS)}", kind)
    for key in ("shards", "classes", "schema", "rows", "image" if kind == "images" else "lengths"):
        need(key in manifest, key, "present", "nothing")
    rows, shards = manifest["rows"], manifest["shards"]
    need(_is_count(rows), "rows", "a count (an int >= 0)", rows)
    need(isinstance(shards, list), "shards", "a list", shards)
    names: set[str] = set()
    for i, shard in enumerate(shards):
        _check_file(shard, f"shards[{i}]", need)
        need(_is_count(shard.get("rows")), f"shards[{i}].rows", "a count (an int >= 0)", shard.get("rows"))
        need(shard["file"] not in names, f"shards[{i}].file", "a name no other shard has", shard["file"])
        names.add(shard["file"])
    total = sum(shard["rows"] for shard in shards)
    need(total == rows, "rows", f"the sum of the shards' rows ({total})", rows)
    classes = manifest["classes"]
    need(isinstance(classes, list) and all(isinstance(c, str) for c in classes), "classes", "a list of strings",
         classes)
    counts = manifest.get("class_counts")
    need(counts is None or (isinstance(counts, list) and all(_is_count(c) for c in counts)), "class_counts",
         "a list of counts", counts)
    schema = manifest["schema"]
    need(isinstance(schema, list), "schema", "a list of {name, type}", schema)
    for i, column in enumerate(schema):
        ok = isinstance(column, dict) and isinstance(column.get("name"), str) and isinstance(column.get("type"), str)
        need(ok, f"schema[{i}]", "a {\"name\": str, \"type\": str} object", column)
    columns = [column["name"] for column in schema]
    payload = "image" if kind == "images" else "tokens"
    need(payload in columns and len(set(columns)) == len(columns), "schema", f"columns of distinct names, "
         f"{payload!r} among them", columns)
    if kind == "tokens":
        _check_tokens(manifest, need)
        return
    if kind == "image_text":
        _check_tokens(manifest, need)
        _check_image_text(manifest, need)
        return
    image = manifest["image"]
    need(isinstance(image, dict) and image.get("kind") in ("encoded", "raw"), "image.kind", "'encoded' or 'raw'",
         image.get("kind") if isinstance(image, dict) else image)
    shape = image.get("shape")
    raw_shape = isinstance(shape, list) and len(shape) == 3 and all(_is_count(n) and n > 0 for n in shape)
    need(raw_shape if image["kind"] == "raw" else shape is None or raw_shape, "image.shape",
         "[height, width, 3]" + (" for raw images" if image["kind"] == "raw" else " or null"), shape)
    labels = manifest.get("labels")
    if labels is not None:
        _check_file(labels, "labels", need)
        need(isinstance(labels.get("dtype"), str), "labels.dtype", "a NumPy dtype's name", labels.get("dtype"))


def _check_tokens(manifest: dict[str, Any], need: Any) -> None:
    """A token manifest's own fields (:mod:`~stallfree.ingest.token_writer`)."""
    vocab = manifest.get("vocab_size")
    need(vocab is None or (_is_count(vocab) and vocab > 0), "vocab_size", "a positive int or null", vocab)
    need(manifest.get("token_dtype") in ("uint16", "int32"), "token_dtype", "'uint16' or 'int32'",
         manifest.get("token_dtype"))
    need(manifest.get("documents") == manifest["rows"], "documents", f"the rows ({manifest['rows']})",
         manifest.get("documents"))
    need(_is_count(manifest.get("tokens")), "tokens", "a count (an int >= 0)", manifest.get("tokens"))
    lengths = manifest["lengths"]
    _check_file(lengths, "lengths", need)
    need(lengths.get("dtype") == "int32", "lengths.dtype", "'int32'", lengths.get("dtype"))


def _check_image_text(manifest: dict[str, Any], need: Any) -> None:
    """An image-text manifest's own fields beyond a token manifest's (:mod:`~stallfree.ingest.image_text_writer`)."""
    need(manifest.get("layout") in ("caption", "conversations"), "layout", "'caption' or 'conversations'",
         manifest.get("layout"))
    need(_is_count(manifest.get("images")), "images", "a count (an int >= 0)", manifest.get("images"))
    need(isinstance(manifest.get("image_placeholder"), str), "image_placeholder", "a string",
         manifest.get("image_placeholder"))
    counts: Any = manifest.get("image_counts")
    _check_file(counts, "image_counts", need)
    need(counts.get("dtype") == "int32", "image_counts.dtype", "'int32'", counts.get("dtype"))


def _check_file(entry: Any, field: str, need: Any) -> None:
    """A ``{"file", "bytes", "sha256"}`` entry: its file a plain name that stays inside the dataset's folder."""
    need(isinstance(entry, dict), field, "an object", entry)
    name = entry.get("file")
    need(isinstance(name, str) and _FILE_NAME.fullmatch(name) is not None, f"{field}.file",
         "a plain file name in the dataset's folder (letters, digits, '.', '_', '-'; no '/', no '..', not hidden)",
         name)
    need(_is_count(entry.get("bytes")), f"{field}.bytes", "a count (an int >= 0)", entry.get("bytes"))
    sha256 = entry.get("sha256")
    need(isinstance(sha256, str) and _SHA256.fullmatch(sha256) is not None, f"{field}.sha256",
         "64 lowercase hex digits", sha256)


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _show(value: Any) -> str:
    """``value`` for a message, cut short (a hostile manifest's field may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


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
