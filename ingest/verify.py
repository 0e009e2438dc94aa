"""``stallfree verify`` and ``stallfree info``: re-check an ingested dataset's shards, and summarise it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stallfree.ingest.manifest import file_sha256, read_manifest, schema_problem
from stallfree.ingest.validate import Rejected, check_image

__all__ = ["info", "verify"]


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


def verify(out: str | os.PathLike[str], *, decode: bool = False) -> list[str]:
    """Every problem found in ``out``'s shards (empty when all is well).

    Checks that each shard exists, has the manifest's size and SHA-256, and opens as an Arrow file with the
    manifest's schema and row count; with ``decode``, decodes every image.

    Raises:
        FileNotFoundError, ValueError: there is no valid manifest.
    """
    import pyarrow as pa
    import pyarrow.ipc as ipc

    out = Path(out)
    manifest = read_manifest(out)
    problems = []
    for shard in manifest["shards"]:
        path = out / shard["file"]
        if not path.is_file():
            problems.append(f"{shard['file']}: missing")
            continue
        size = path.stat().st_size
        if size != shard["bytes"]:
            problems.append(f"{shard['file']}: {size} bytes, the manifest says {shard['bytes']} (truncated?)")
            continue
        altered = file_sha256(path) != shard["sha256"]
        if altered:
            problems.append(f"{shard['file']}: SHA-256 differs from the manifest's (the file was altered)")
        try:
            with pa.memory_map(str(path)) as source:
                reader = ipc.open_file(source)
                # An altered file still gets its schema compared: a damaged footer is then named by its column.
                schema = schema_problem(reader.schema, manifest["schema"])
                rows = None if altered or schema else reader.read_all().num_rows
        except (pa.ArrowException, OSError) as err:
            problems.append(f"{shard['file']}: not a readable Arrow file ({err})")
            continue
        if schema is not None:
            problems.append(f"{shard['file']}: {schema} (a damaged footer?)")
        elif rows is None:  # altered: its rows are not worth reading
            continue
        elif rows != shard["rows"]:
            problems.append(f"{shard['file']}: {rows} rows, the manifest says {shard['rows']}")
        elif decode:
            problems.extend(_decode_all(path, manifest["image"]["shape"]))
    return problems


def info(out: str | os.PathLike[str]) -> dict[str, Any]:
    """A summary of ``out``: rows, shards, size, classes with their counts, image kind, source and options."""
    manifest = read_manifest(out)
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
