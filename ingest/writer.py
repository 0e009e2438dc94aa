"""Writing one shard: its samples' bytes fetched, checked and converted (in chunks, by workers), then one Arrow file.

A shard is written under a temporary name and renamed when complete; then its *record* (rows, size, SHA-256,
rejected samples, class counts) is written to ``.ingest/shard-NNNNN.json`` the same way. A shard counts as done
only when its record exists, so a crash at any point leaves either a finished shard or one that is redone.
"""

from __future__ import annotations

import errno
import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stallfree.core.atomic import atomic_path, atomic_write
from stallfree.ingest.manifest import file_sha256
from stallfree.ingest.sources import DEFAULT_MAX_SAMPLE_BYTES, Item
from stallfree.ingest.validate import DEFAULT_MAX_PIXELS, Rejected, check_image, convert

__all__ = ["BATCH_ROWS", "RECORDS", "Converted", "IngestOptions", "convert_items", "record_path", "write_shard"]

#: Rows per Arrow record batch inside a shard (a shard holds one or more batches).
BATCH_ROWS = 1024
#: The folder, inside the output, where finished shards' records wait for the manifest.
RECORDS = ".ingest"


@dataclass(frozen=True)
class IngestOptions:
    """The options that decide a shard's bytes (and so go into the manifest).

    Args:
        shard_mb: target shard size in MB (10**6 bytes), estimated from the source bytes before conversion (from
            ``height * width * 3`` with ``raw``).
        max_side: re-encode images whose longer side exceeds this as JPEG of that longer side.
        quality: JPEG quality of re-encoded images.
        raw: ``(height, width)``: store decoded RGB pixels resized to this instead of encoded bytes.
        validate: decode every image fully (else only its header and end marker are checked).
        max_pixels: reject images whose header claims more pixels.
        max_sample_bytes: reject samples (files, tar members, Parquet cells) larger than this, before reading them.
    """

    shard_mb: float = 256.0
    max_side: int | None = None
    quality: int = 90
    raw: tuple[int, int] | None = None
    validate: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES

    def __post_init__(self) -> None:
        if not self.shard_mb > 0:
            raise ValueError(f"shard size must be positive MB, got {self.shard_mb}")
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"--max-side must be >= 1, got {self.max_side}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"--quality must be in 1..100, got {self.quality}")
        if self.raw is not None and (len(self.raw) != 2 or min(self.raw) < 1):
            raise ValueError(f"--raw must be HxW with positive sides, got {self.raw}")
        if self.raw is not None and self.max_side is not None:
            raise ValueError("--raw and --max-side exclude each other (--raw already fixes the size)")
        if self.max_pixels < 1:
            raise ValueError(f"--max-pixels must be positive, got {self.max_pixels}")
        if self.max_sample_bytes < 1:
            raise ValueError(f"--max-sample-bytes must be positive, got {self.max_sample_bytes}")

    def to_json(self) -> dict[str, Any]:
        """The options as JSON values."""
        out = asdict(self)
        out["raw"] = list(self.raw) if self.raw else None
        return out


def record_path(out: Path, name: str) -> Path:
    """Where the record of the shard file ``name`` goes."""
    return out / RECORDS / (name.removesuffix(".arrow") + ".json")


def _schema(extra_columns: list[tuple[str, str]], options: IngestOptions) -> Any:
    import pyarrow as pa

    fields = [
        pa.field("key", pa.string()),
        pa.field("label", pa.int64()),
        pa.field("image", pa.binary()),
        pa.field("height", pa.int32()),
        pa.field("width", pa.int32()),
    ]
    taken = {f.name for f in fields}
    for name, kind in extra_columns:
        if name in taken:
            raise ValueError(f"the source's column {name!r} clashes with a shard column {sorted(taken)}; rename it")
        fields.append(pa.field(name, pa.type_for_alias(kind) if kind in _ALIASES else pa.string()))
    raw = {"raw_height": str(options.raw[0]), "raw_width": str(options.raw[1])} if options.raw else {}
    return pa.schema(fields, metadata={"stallfree": "1", **raw})


_ALIASES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float", "double",
            "float32", "float64", "bool", "string", "large_string", "binary", "date32"}


#: One piece of a shard's work: its columns (lists), its rejected samples, and the source bytes it read.
Converted = tuple[dict[str, list[Any]], list[dict[str, str]], int]


def convert_items(items: list[Item], options: IngestOptions, extra_columns: list[tuple[str, str]]) -> Converted:
    """Fetch, check and convert ``items``: the work a worker process does for one chunk of a shard."""
    import pyarrow as pa

    from stallfree.ingest.sources import fetch_many

    schema = _schema(extra_columns, options)
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    rejected: list[dict[str, str]] = []
    source_bytes = 0
    for item, data in zip(items, fetch_many(items, options.max_sample_bytes), strict=True):
        if isinstance(data, OSError):
            why = data.strerror or str(data)
            rejected.append({"path": item.key, "reason": why if data.errno == errno.EFBIG else f"unreadable: {why}"})
            continue
        source_bytes += len(data)
        try:
            checked = check_image(data, max_pixels=options.max_pixels, validate=options.validate)
            stored, height, width = convert(data, checked, max_side=options.max_side, quality=options.quality,
                                            raw=options.raw)
        except Rejected as bad:
            rejected.append({"path": item.key, "reason": bad.reason})
            continue
        for name, value in zip(("key", "label", "image", "height", "width"),
                               (item.key, item.label, stored, height, width), strict=True):
            columns[name].append(value)
        for (name, _kind), value in zip(extra_columns, item.extras, strict=True):
            columns[name].append(value if schema.field(name).type != pa.string() or value is None else str(value))
    return columns, rejected, source_bytes


def write_shard(
    out: Path,
    name: str,
    pieces: list[Converted],
    options: IngestOptions,
    extra_columns: list[tuple[str, str]],
) -> dict[str, Any]:
    """Write the shard file ``name`` from its converted ``pieces`` (in order) into ``out``, then its record.

    The record is ``{"file", "rows", "bytes", "sha256", "source_bytes", "rejected": [{"path", "reason"}],
    "class_counts": {label: count}}``.
    """
    import pyarrow as pa
    import pyarrow.ipc as ipc

    schema = _schema(extra_columns, options)
    columns: dict[str, list[Any]] = {name: [v for piece in pieces for v in piece[0][name]] for name in schema.names}
    rejected = [r for piece in pieces for r in piece[1]]
    source_bytes = sum(piece[2] for piece in pieces)
    path = out / name
    rows = len(columns["key"])
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema) as writer:
        for start in range(0, max(rows, 1), BATCH_ROWS):
            part = {k: v[start : start + BATCH_ROWS] for k, v in columns.items()}
            writer.write_batch(pa.record_batch([pa.array(part[f.name], f.type) for f in schema], schema=schema))
    record = {
        "file": name,
        "rows": rows,
        "bytes": path.stat().st_size,
        "sha256": file_sha256(path),
        "source_bytes": source_bytes,
        "rejected": rejected,
        "class_counts": {str(k): v for k, v in sorted(Counter(columns["label"]).items())},
    }
    record_file = record_path(out, name)
    record_file.parent.mkdir(exist_ok=True)
    atomic_write(record_file, json.dumps(record, sort_keys=True).encode())
    return record
