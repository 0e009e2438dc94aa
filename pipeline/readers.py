"""Readers: random access by row to a dataset's encoded images and labels.

Every source (an ImageFolder tree, a CSV or Parquet file list, ingested Arrow shards) is a :class:`Reader`; the
sampler decides the order, the reader only answers "row i". :func:`open_source` picks the reader for a path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from stallfree.pipeline.shards import ShardReader, is_shard_folder

__all__ = ["IMAGE_EXTENSIONS", "FileListReader", "FolderReader", "Reader", "open_source"]

#: File suffixes an ImageFolder scan keeps (torchvision's ``IMG_EXTENSIONS``, lower-cased).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@runtime_checkable
class Reader(Protocol):
    """Row access to a dataset. ``read`` may raise ``OSError`` for a missing or unreadable file."""

    classes: list[str]

    def __len__(self) -> int: ...

    def labels(self) -> np.ndarray:
        """Every row's label, int64, without reading any image."""
        ...

    def read(self, index: int) -> np.ndarray:
        """Row ``index``'s encoded image as a 1-D uint8 array."""
        ...

    def describe(self, index: int) -> str:
        """Where row ``index`` lives, for error messages (a path, or a shard and row)."""
        ...


class _PathReader:
    """Rows that are files on a file system."""

    def __init__(self, paths: list[Path], labels: np.ndarray, classes: list[str]):
        self.paths, self._labels, self.classes = paths, labels, classes

    def __len__(self) -> int:
        return len(self.paths)

    def labels(self) -> np.ndarray:
        return self._labels

    def read(self, index: int) -> np.ndarray:
        with open(self.paths[index], "rb") as f:
            return np.frombuffer(f.read(), np.uint8)

    def describe(self, index: int) -> str:
        return str(self.paths[index])


class FolderReader(_PathReader):
    """torchvision's ImageFolder layout: ``root/<class>/<file>``, classes are the sorted sub-folder names.

    Raises:
        NotADirectoryError: ``root`` is not a folder.
        ValueError: it has no class folders, or they hold no image files.
    """

    def __init__(self, root: str | os.PathLike[str]):
        root = Path(root)
        if not root.is_dir():
            raise NotADirectoryError(f"image folder {root} does not exist or is not a directory")
        classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        if not classes:
            raise ValueError(f"image folder {root} has no class sub-folders (expected root/<class>/<image>)")
        paths: list[Path] = []
        labels: list[int] = []
        for label, name in enumerate(classes):
            for dirpath, _dirs, files in sorted(os.walk(root / name, followlinks=True)):
                for file in sorted(files):
                    if file.lower().endswith(IMAGE_EXTENSIONS):
                        paths.append(Path(dirpath) / file)
                        labels.append(label)
        if not paths:
            raise ValueError(f"image folder {root} has class folders {classes[:5]} but no images {IMAGE_EXTENSIONS}")
        super().__init__(paths, np.asarray(labels, np.int64), classes)


class FileListReader(_PathReader):
    """A CSV or Parquet table with ``path`` and ``label`` columns; paths are relative to the table's folder.

    Integer labels are used as they are; string labels become indices into their sorted unique names.

    Raises:
        FileNotFoundError: the list does not exist.
        ValueError: a missing column, an empty list, a negative or missing label.
    """

    def __init__(self, table_path: str | os.PathLike[str]):
        import pyarrow.compute as pc

        table_path = Path(table_path)
        if not table_path.is_file():
            raise FileNotFoundError(f"file list {table_path} does not exist")
        if table_path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(table_path, columns=None)
        else:
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(table_path)
        missing = {"path", "label"} - set(table.column_names)
        if missing:
            raise ValueError(f"file list {table_path} lacks column(s) {sorted(missing)}; it has {table.column_names}")
        if table.num_rows == 0:
            raise ValueError(f"file list {table_path} has no rows")
        if table.column("label").null_count or table.column("path").null_count:
            raise ValueError(f"file list {table_path} has empty path or label cells")
        base = table_path.parent
        paths = [base / p for p in table.column("path").to_pylist()]
        label_column = table.column("label")
        if label_column.type in ("string", "large_string"):
            classes = sorted(set(label_column.to_pylist()))
            index = {name: i for i, name in enumerate(classes)}
            labels = np.asarray([index[v] for v in label_column.to_pylist()], np.int64)
        else:
            labels = np.asarray(label_column.to_numpy(), np.int64)
            if int(pc.min(label_column).as_py()) < 0:
                row = int(np.argmax(labels < 0))
                raise ValueError(f"file list {table_path} row {row}: negative label {labels[row]}")
            classes = [str(i) for i in range(int(labels.max()) + 1)]
        super().__init__(paths, labels, classes)


def open_source(source: str | os.PathLike[str] | Reader) -> Reader:
    """The reader for ``source``: a Reader as it is, an ingested shard folder, a CSV/Parquet list, an image folder."""
    if isinstance(source, Reader):
        return source
    path = Path(source)
    if is_shard_folder(path):
        return ShardReader(path)
    if path.suffix.lower() in (".csv", ".parquet"):
        return FileListReader(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset {path} does not exist")
    return FolderReader(path)
