"""Sources ingest reads: an ImageFolder tree, a CSV/Parquet file list, Parquet holding image bytes, WebDataset tars.

Listing a source gives a :class:`Plan`: every sample in a fixed order, with its label, extra column values, where
its bytes are (a :data:`Locator`) and their size, plus the samples refused before any byte is read (paths that
escape the source root). The plan is computed the same way on every run, which is what makes a resumed ingest
produce the same shards. Bytes are fetched later, in the workers, by :func:`fetch_many`.

A source is a sequence of units, each listed on its own: an image folder's class folders, a file list's rows, a
Parquet file's row groups, a folder's tars. Part ``i`` of ``N`` (``stallfree ingest --part``) lists only the
``i``-th contiguous ``1/N`` of the units (:func:`part_units`), so that no part pays for the whole listing; the
parts' listings, one after another, are the whole source's in its order. What every part needs to agree on (the
class names, the number of units) costs a directory listing or a column read, never a file's ``stat``.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.ingest.folders import image_folder_classes, outside_root, scan_image_folder
from stallfree.ingest.hf_parquet import EMBED_HINT, check_class_labels, hf_columns
from stallfree.ingest.labels import class_numbers, label_column
from stallfree.ingest.tars import compressed, label_bytes, members, samples, too_large

__all__ = ["DEFAULT_MAX_SAMPLE_BYTES", "Item", "Plan", "fetch_many", "part_units", "plan_source"]

#: The default ``--max-sample-bytes``: no training image is this large, and a worker holds a few at once.
DEFAULT_MAX_SAMPLE_BYTES = 256 << 20

#: Where a sample's bytes are: ("file", path) | ("tar", tar path, offset, size) | ("parquet", path, row).
Locator = tuple[Any, ...]


@dataclass(frozen=True, slots=True)  # one per sample of a listing: no per-object dict
class Item:
    """One sample of a source: ``key`` names it in errors and in the shard's ``key`` column."""

    key: str
    label: int
    locator: Locator
    size: int
    extras: tuple[Any, ...] = ()


@dataclass
class Plan:
    """A listed source: ``items`` in order, ``rejected`` as ``{"path", "reason"}`` records, and what it is."""

    kind: str
    path: str
    classes: list[str]
    items: list[Item] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    extra_columns: list[tuple[str, str]] = field(default_factory=list)  # (name, Arrow type string)
    units: int = 1  # how many units the whole source has (class folders, rows, row groups, tars), listed or not


def part_units(units: int, part: tuple[int, int]) -> range:
    """The units part ``(i, N)`` lists: the ``i``-th of ``N`` contiguous, near-equal runs of ``range(units)``."""
    index, count = part
    return range(units * index // count, units * (index + 1) // count)


def _folder(root: Path, part: tuple[int, int]) -> Plan:
    classes = image_folder_classes(root)
    scan = scan_image_folder(root, None if part == (0, 1) else part_units(len(classes), part))
    plan = Plan("folder", str(root.resolve()), scan.classes, rejected=list(scan.refused), units=len(classes))
    root_text = os.fspath(root)
    for key, label in scan.files:
        path = os.path.join(root_text, key)  # the scan's keys are normal: the same string as str(root / key)
        plan.items.append(Item(key, label, ("file", path), os.path.getsize(path)))
    return plan


def _image_column(schema: Any) -> str | None:
    """The column holding image bytes: a struct with ``bytes`` (``{bytes, path}``), or a binary column."""
    import pyarrow as pa

    for name in schema.names:
        kind = schema.field(name).type
        if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
            return name
    binary = [n for n in schema.names if pa.types.is_binary(schema.field(n).type)
              or pa.types.is_large_binary(schema.field(n).type)]
    for preferred in ("image", "bytes", "jpg", "png"):
        if preferred in binary:
            return preferred
    return binary[0] if binary else None


def _table(path: Path) -> Any:
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    import pyarrow.csv as pacsv

    return pacsv.read_csv(path)


def _extras(table: Any, skip: set[str]) -> tuple[list[tuple[str, str]], list[tuple[Any, ...]]]:
    names = [n for n in table.schema.names if n not in skip]
    columns = [table.column(n).to_pylist() for n in names]
    kinds = [(n, str(table.schema.field(n).type)) for n in names]
    return kinds, list(zip(*columns, strict=True)) if columns else [() for _ in range(table.num_rows)]


def _table_source(path: Path, part: tuple[int, int]) -> Plan:
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        hf = hf_columns(schema, f"Parquet {path}")
        if hf is not None:
            return _bytes_table(path, hf.image, part, hf.label, hf.classes)
        image_column = _image_column(schema)
        if image_column is not None:
            return _bytes_table(path, image_column, part)
    table = _table(path)
    missing = {"path", "label"} - set(table.column_names)
    if missing:
        raise ValueError(f"file list {path} lacks column(s) {sorted(missing)}; it has {table.column_names}")
    if table.num_rows == 0:
        raise ValueError(f"file list {path} has no rows")
    labels, classes = label_column(table.column("label"), f"file list {path}")
    rows = part_units(table.num_rows, part)
    table = table.slice(rows.start, len(rows))  # the rest is another part's: no stat, no Python objects
    kinds, extras = _extras(table, {"path", "label"})
    plan = Plan("file_list", str(path.resolve()), classes, extra_columns=kinds, units=len(labels))
    keys = ["" if key is None else str(key) for key in table.column("path").to_pylist()]
    root = os.fspath(path.parent)
    for key, label, extra, problem in zip(keys, labels[rows.start:rows.stop].tolist(), extras,
                                          outside_root(path.parent, keys), strict=True):
        if problem is not None:
            plan.rejected.append({"path": key, "reason": problem})
            continue
        file, size = _regular_file(root, key)
        if isinstance(size, str):
            plan.rejected.append({"path": key, "reason": size})
        else:
            plan.items.append(Item(key, label, ("file", file), size, extra))
    return plan


def _regular_file(root: str, key: str) -> tuple[str, int | str]:
    """The file ``key`` names under ``root`` (checked by :func:`outside_root`), and its size or why it is refused."""
    file = os.path.join(root, os.path.normpath(key))  # strings, not a Path per row: a list may hold millions
    try:
        found = os.stat(file)
    except (FileNotFoundError, NotADirectoryError):
        return file, "missing file"
    except OSError as err:
        return file, f"unreadable: {err.strerror or err}"
    return file, found.st_size if stat.S_ISREG(found.st_mode) else "missing file"


def _bytes_table(path: Path, image_column: str, part: tuple[int, int], label: str = "label",
                 classes: list[str] | None = None) -> Plan:
    """A Parquet file of images, listed one row group at a time (its images never all sit in memory).

    Its units are row groups: the image sizes come from reading the images, so a part reads only its own groups'.
    A ``{bytes, path}`` cell (a Hugging Face ``Image``) gives its bytes, else the file its path names under the
    Parquet file's folder (:func:`~stallfree.ingest.folders.outside_root`'s rule). ``classes``: the label column's
    class names (a ``ClassLabel``'s), else its numbers or names decide them.
    """
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    others = [n for n in parquet.schema_arrow.names if n != image_column]
    if label not in others:
        raise ValueError(f"Parquet {path} holds images in {image_column!r} but has no {label!r} column")
    table = parquet.read(columns=others)
    where = f"Parquet {path}"
    if classes is None:
        labels, classes = label_column(table.column(label), where)
    else:
        labels = check_class_labels(table.column(label).combine_chunks(), classes, where, label)
    groups = part_units(parquet.num_row_groups, part)
    first = sum(parquet.metadata.row_group(g).num_rows for g in range(groups.start))
    table = table.slice(first, sum(parquet.metadata.row_group(g).num_rows for g in groups))
    names, sizes = _cells(parquet, image_column, list(groups))
    kinds, extras = _extras(table, {label})
    plan = Plan("parquet_bytes", str(path.resolve()), classes, extra_columns=kinds, units=parquet.num_row_groups)
    mine = labels[first:first + table.num_rows].tolist()
    # the rows without bytes read their path: checked all at once, as a file list's are
    problems = iter(outside_root(path.parent, [name for name, size in zip(names, sizes, strict=True)
                                               if size is None and name]))
    located = str(path.resolve())
    for row, (name, label_value, size, extra) in enumerate(zip(names, mine, sizes, extras, strict=True), start=first):
        key = f"{path.name}:{row}" if name is None else f"{path.name}:{row}:{name}"
        if size is not None:
            plan.items.append(Item(key, label_value, ("parquet", located, row, image_column), size, extra))
            continue
        if not name:
            why = f"row {row}: its {image_column!r} cell holds neither image bytes nor a path"
            plan.rejected.append({"path": key, "reason": why})
            continue
        problem = next(problems)
        file, found = (None, problem) if problem is not None else _regular_file(os.fspath(path.parent), name)
        if isinstance(found, str):
            hint = (f"; give paths relative to the Parquet file's folder, or {EMBED_HINT}"
                    if problem is not None and os.path.isabs(name) else "")
            why = (f"row {row}: no image bytes, and its path {name!r} (read under the Parquet file's folder) is "
                   f"refused: {found}{hint}")
            plan.rejected.append({"path": key, "reason": why})
        else:
            plan.items.append(Item(key, label_value, ("file", file), found, extra))
    return plan


def _cells(parquet: Any, image_column: str, groups: list[int]) -> tuple[list[str | None], list[int | None]]:
    """Each row's image path (a ``{bytes, path}`` struct's, else ``None``) and its bytes' size (``None``: null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names: list[str | None] = []
    sizes: list[int | None] = []
    for batch in parquet.iter_batches(columns=[image_column], batch_size=4096, row_groups=groups):
        column = batch.column(0)
        if pa.types.is_struct(column.type):
            has_path = column.type.get_field_index("path") >= 0
            names.extend(pc.struct_field(column, "path").to_pylist() if has_path else [None] * len(column))
            # a null struct is a null cell: its fields' values do not count
            column = pc.if_else(pc.is_valid(column), pc.struct_field(column, "bytes"), None)
        else:
            names.extend([None] * len(column))
        sizes.extend(pc.binary_length(column).to_pylist())
    return names, sizes


def _tars(source: Path, part: tuple[int, int]) -> tuple[list[Path], int]:
    """This part's tars, and how many the source has."""
    every = [source] if source.is_file() else sorted(source.glob("*.tar"))
    tars = [every[i] for i in part_units(len(every), part)]
    for tar in tars:
        with open(tar, "rb") as f:
            if compressed(f.read(3)):
                raise ValueError(f"{tar} is compressed; WebDataset ingest needs uncompressed .tar shards "
                                 "(random access)")
    return tars, len(every)


def _webdataset(source: Path, max_sample_bytes: int | None, part: tuple[int, int]) -> Plan:
    """Tars' samples; the classes are ``0..`` the largest label this part's tars hold (a merge takes the largest)."""
    tars, units = _tars(source, part)
    plan = Plan("webdataset", str(source.resolve()), [], units=units)
    for tar_path in tars:
        try:
            tar = tarfile.open(tar_path, "r:")
        except tarfile.ReadError as err:
            plan.rejected.append({"path": tar_path.name, "reason": f"not a readable tar ({err}); all of it rejected"})
            continue
        with tar:  # headers only: nothing is extracted to disk
            listed = members(tar, tar_path.name, os.path.getsize(tar_path), plan.rejected)
            found = samples(tar_path.name, listed, label_bytes(tar), plan.rejected, max_sample_bytes)
        location = str(tar_path.resolve())
        plan.items += [Item(f"{tar_path.name}:{s.key}", s.label, ("tar", location, s.offset, s.size), s.size)
                       for s in found]
    if not plan.items and not plan.rejected and part == (0, 1):
        raise ValueError(f"no WebDataset samples (.jpg/.png + .cls) in {source}")
    plan.classes = class_numbers(np.fromiter((item.label for item in plan.items), np.int64, len(plan.items)))
    return plan


def plan_source(source: str | os.PathLike[str], *, max_sample_bytes: int | None = None,
                part: tuple[int, int] = (0, 1)) -> Plan:
    """List ``source``: a ``.csv``/``.parquet`` file, a ``.tar`` or a folder of them, or an ImageFolder tree.

    ``part`` ``(i, N)`` lists only the units :func:`part_units` gives part ``i`` (see the module docstring).

    ``max_sample_bytes`` refuses samples whose listed size (a file's ``stat``, a tar header, a Parquet cell's
    length) is larger, before any of their bytes are read: a tar header or a sparse file may claim gigabytes.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: a source of no known kind, missing columns, bad labels, compressed tars.
    """
    plan = _list(Path(source), max_sample_bytes, part)
    if max_sample_bytes is not None:  # the files' and Parquet cells' sizes (a tar's were checked by member)
        kept = [item for item in plan.items if item.size <= max_sample_bytes]
        plan.rejected += [{"path": item.key, "reason": too_large(item.size, max_sample_bytes)}
                          for item in plan.items if item.size > max_sample_bytes]
        plan.items = kept
    return plan


def _list(path: Path, max_sample_bytes: int | None, part: tuple[int, int]) -> Plan:
    if not path.exists():
        raise FileNotFoundError(f"source {path} does not exist")
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".csv", ".parquet"):
            return _table_source(path, part)
        if suffix == ".tar":
            return _webdataset(path, max_sample_bytes, part)
        raise ValueError(f"source {path}: expected an image folder, a .csv/.parquet list or a .tar, got {suffix!r}")
    with os.scandir(path) as entries:
        has_dirs = any(entry.is_dir() for entry in entries)
    if not has_dirs and any(path.glob("*.tar")):
        return _webdataset(path, max_sample_bytes, part)
    return _folder(path, part)


def fetch_many(items: list[Item], max_bytes: int | None = None) -> list[bytes | OSError]:
    """Every item's bytes, in order (an ``OSError`` in place of a file that cannot be read, or is over ``max_bytes``).

    The listing already refused items over the limit; a file is read only up to it again because it may have grown
    since (the other kinds' sizes are fixed by their tar header or Parquet cell).
    """
    out: list[bytes | OSError] = [b""] * len(items)
    tables: dict[tuple[str, str], list[int]] = {}
    for i, item in enumerate(items):
        kind = item.locator[0]
        try:
            if kind == "file":
                with open(item.locator[1], "rb") as f:
                    data = f.read(-1 if max_bytes is None else max_bytes + 1)
                if max_bytes is not None and len(data) > max_bytes:
                    raise OSError(errno.EFBIG, too_large(os.path.getsize(item.locator[1]), max_bytes))
                out[i] = data
            elif kind == "tar":
                with open(item.locator[1], "rb") as f:
                    f.seek(item.locator[2])
                    data = f.read(item.locator[3])
                if len(data) != item.locator[3]:
                    raise OSError(f"tar {item.locator[1]} ends inside member {item.key}")
                out[i] = data
            else:
                tables.setdefault((item.locator[1], item.locator[3]), []).append(i)
        except OSError as err:
            out[i] = err
    for (path, column), positions in tables.items():
        for i, data in zip(positions, _parquet_rows(path, column, [items[i].locator[2] for i in positions]),
                           strict=True):
            out[i] = data
    return out


def _parquet_rows(path: str, column: str, rows: list[int]) -> list[bytes]:
    """Rows' image bytes, reading only the row groups that hold them."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    starts = [0]
    for g in range(parquet.num_row_groups):
        starts.append(starts[-1] + parquet.metadata.row_group(g).num_rows)
    groups = sorted({next(g for g in range(len(starts) - 1) if starts[g] <= r < starts[g + 1]) for r in rows})
    table = parquet.read_row_groups(groups, columns=[column])
    values = table.column(column)
    if hasattr(values.type, "get_field_index") and values.type.num_fields:
        values = pc.struct_field(values, "bytes")
    offset, base = {}, 0
    for g in groups:
        offset[g] = base
        base += starts[g + 1] - starts[g]
    result = []
    for r in rows:
        g = next(g for g in groups if starts[g] <= r < starts[g + 1])
        value = values[offset[g] + r - starts[g]].as_py()
        result.append(value or b"")
    return result
