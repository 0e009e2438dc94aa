"""Readers: random access by row to a dataset's encoded images and labels.

Every source (an ImageFolder tree, a CSV or Parquet file list, ingested Arrow shards, a map-style torch Dataset)
is a :class:`Reader`; the sampler decides the order, the reader only answers "row i". :func:`open_source` picks
the reader for a path or a Dataset.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from stallfree.ingest.folders import inside_root, scan_image_folder
from stallfree.ingest.images import Exif
from stallfree.ingest.labels import class_numbers, label_array, label_column
from stallfree.ingest.remote import is_url
from stallfree.ingest.text_sources import is_token_source
from stallfree.pipeline.hf_reader import HuggingFaceReader, is_hf_dataset
from stallfree.pipeline.image_text_reader import ImageTextShardReader, is_image_text_folder
from stallfree.pipeline.reader_base import BaseReader, Reader, Sample, as_reader
from stallfree.pipeline.remote_tokens import open_remote
from stallfree.pipeline.shards import ShardReader, Verify, is_shard_folder
from stallfree.pipeline.subset import SubsetReader, subset_rows
from stallfree.pipeline.token_readers import (
    HuggingFaceTokenReader,
    TokenFileReader,
    TokenShardReader,
    is_token_dataset,
    is_token_folder,
)
from stallfree.pipeline.webdataset import WebDatasetReader, is_webdataset

__all__ = [
    "BaseReader", "DatasetReader", "FileListReader", "FolderReader", "Reader", "open_source",
    "unwrap_torchvision_dataset",
]


class _PathReader(BaseReader):
    """Rows that are files on a file system."""

    def __init__(self, paths: list[Path], labels: np.ndarray, classes: list[str]):
        super().__init__()
        self.paths, self._labels, self.classes = paths, labels, classes

    def __len__(self) -> int:
        return len(self.paths)

    def labels(self) -> np.ndarray:
        return self._labels

    def read(self, index: int) -> Sample:
        """Row ``index``'s fields: ``{"image": ...}`` (:meth:`read_image`)."""
        return {"image": self.read_image(index)}

    def read_image(self, index: int) -> np.ndarray:
        """Row ``index``'s file, as encoded bytes."""
        with open(self.paths[index], "rb") as f:
            return np.frombuffer(f.read(), np.uint8)

    def describe(self, index: int) -> str:
        return str(self.paths[index])

    def fingerprint(self) -> str:
        """The files relative to their common folder, and their labels, hashed: the same wherever the data lies."""
        names = [str(p) for p in self.paths]
        common = os.path.commonprefix([min(names), max(names)])  # the common prefix of all, from the extremes
        cut = common.rfind(os.sep) + 1
        digest = hashlib.sha256("\0".join(name[cut:] for name in names).encode())
        digest.update(np.ascontiguousarray(self._labels, np.int64).tobytes())
        return digest.hexdigest()


def _refuse_outside(root: Path, relative: list[str], where: str, rows: bool = False) -> list[Path]:
    """``root/path`` for each path, or a ValueError naming the first that leaves ``root`` (ingest's rule)."""
    checked = inside_root(root, relative)
    for i, (path, problem) in enumerate(checked):
        if path is None:
            name = f" row {i}: path {relative[i]!r}" if rows else f": {relative[i]}"
            raise ValueError(f"{where}{name} is refused: {problem}; every file must lie inside {root} (move it "
                             "there, or list it relative to that folder)")
    return [path for path, _ in checked if path is not None]


class FolderReader(_PathReader):
    """torchvision's ImageFolder layout: ``root/<class>/<file>``, classes are the sorted sub-folder names.

    Raises:
        NotADirectoryError: ``root`` is not a folder.
        ValueError: it has no class folders, they hold no image files, or a link leads out of ``root`` (links
            inside it are followed, as torchvision does).
    """

    def __init__(self, root: str | os.PathLike[str]):
        root = Path(root)
        scan = scan_image_folder(root)
        if scan.refused:
            first = scan.refused[0]
            raise ValueError(f"image folder {root}: {first['path']} is refused: {first['reason']}; every file must "
                             f"lie inside {root} (move it there, or remove the link)")
        paths = [root / key for key, _ in scan.files]
        labels = np.asarray([label for _, label in scan.files], np.int64)
        super().__init__(paths, labels, scan.classes)


class FileListReader(_PathReader):
    """A CSV or Parquet table with ``path`` and ``label`` columns; paths are relative to the table's folder.

    Labels follow ingest's rule (:mod:`stallfree.ingest.labels`): whole numbers in ``0 .. MAX_CLASSES - 1`` are used
    as they are; string labels become indices into their sorted unique names.

    Raises:
        FileNotFoundError: the list does not exist.
        ValueError: a missing column, an empty list, a missing label or one that is not a class number or name (each
            naming its row), or a path that leaves the list's folder (absolute, with ``..``, or through a link; the
            rule ingest applies too).
    """

    def __init__(self, table_path: str | os.PathLike[str]):
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
        rows = [str(p) for p in table.column("path").to_pylist()]
        paths = _refuse_outside(table_path.parent, rows, f"file list {table_path}", rows=True)
        labels, classes = label_column(table.column("label"), f"file list {table_path}")  # ingest's rule
        super().__init__(paths, labels, classes)


class DatasetReader(BaseReader):
    """A map-style torch ``Dataset`` whose items are ``(image, label)``, as a source for the Loader.

    The image is encoded bytes (``bytes``, ``bytearray``, ``memoryview`` or a 1-D uint8 array: decoded in the
    graph, like files) or decoded pixels (a PIL image, converted to RGB, or an HWC uint8 RGB array). Item 0 decides
    which; every item must then be of the same kind. The Loader reads items from ``io_threads`` threads at once,
    so ``__getitem__`` must be thread-safe (reading a file or a key is).

    EXIF orientation: encoded items follow the Loader's ``exif=`` as files do. A PIL image is taken as the dataset
    gives it under ``exif="ignore"``; under ``"apply"`` it is turned by the orientation tag it still carries
    (``ImageOps.exif_transpose``: ``Image.open(f)`` keeps the tag, an image already transposed has none left), so
    a dataset returning ``Image.open(path)`` gives the folder's pixels under both settings. An array carries no
    tag and is taken as it is. The Loader sets :attr:`exif` on its own copy of a reader passed to it.

    The Loader needs every label before it reads any image; they come from ``labels`` if given, else from the
    dataset's ``targets`` (torchvision's datasets have one). Each item's own label is checked against them.

    Args:
        dataset: the dataset (``__len__`` and ``__getitem__``).
        labels: every item's label, in order; default ``dataset.targets``.
        classes: class names, index = label; default ``dataset.classes``, else the label numbers.

    Raises:
        TypeError: the dataset is iterable-style, without random access.
        ValueError: it is empty, has no labels to go by, or a label is not a whole number in
            ``0 .. MAX_CLASSES - 1`` (naming the item).
    """

    def __init__(self, dataset: Any, labels: Sequence[int] | None = None, classes: Sequence[str] | None = None):
        from torch.utils.data import IterableDataset

        super().__init__()
        # torch's IterableDataset inherits a __getitem__ that only raises, so it is refused by type.
        random_access = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
        if isinstance(dataset, IterableDataset) or not random_access:
            raise TypeError(
                f"{type(dataset).__name__} has no __getitem__/__len__: the Loader needs a map-style Dataset, whose "
                "items it can read in any order (an IterableDataset only streams)"
            )
        self.dataset, self.name = dataset, type(dataset).__name__
        if len(dataset) == 0:
            raise ValueError(f"dataset {self.name} is empty")
        if labels is None:
            labels = getattr(dataset, "targets", None)
        if labels is None:
            raise ValueError(
                f"dataset {self.name} has no `targets`: pass labels=[...] (every item's label, in order) to "
                "DatasetReader, as in Loader(stallfree.DatasetReader(dataset, labels=[...]), ...), since the Loader "
                "needs them before it reads any image"
            )
        self._labels = label_array(np.asarray(labels).reshape(-1), f"dataset {self.name}", unit="item")
        if len(self._labels) != len(dataset):
            raise ValueError(f"dataset {self.name} has {len(dataset)} items but {len(self._labels)} labels")
        names = classes if classes is not None else getattr(dataset, "classes", None)
        self.classes = list(names) if names is not None else class_numbers(self._labels)
        self.exif: Exif = "ignore"
        self.encoded = self._image(0, self._item(0)[0])[1]

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self) -> np.ndarray:
        return self._labels

    def describe(self, index: int) -> str:
        return f"{self.name}[{index}]"

    def read(self, index: int) -> Sample:
        """Row ``index``'s fields: ``{"image": ...}`` (:meth:`read_image`)."""
        return {"image": self.read_image(index)}

    def read_image(self, index: int) -> np.ndarray:
        """Item ``index``'s image: encoded bytes as a 1-D uint8 array, or HWC uint8 RGB pixels.

        Raises:
            ValueError: the item is not ``(image, label)``, its image is of the wrong kind, or its label differs.
        """
        image, label = self._item(index)
        if int(label) != self._labels[index]:
            raise ValueError(f"{self.describe(index)} has label {int(label)} but the labels say {self._labels[index]}")
        pixels, encoded = self._image(index, image)
        if encoded != self.encoded:
            kinds = {True: "encoded bytes", False: "decoded pixels"}
            raise ValueError(f"{self.describe(index)} gives {kinds[encoded]} but item 0 gave {kinds[self.encoded]}; "
                             "every item must give the same kind")
        return pixels

    def _item(self, index: int) -> tuple[Any, Any]:
        item = self.dataset[index]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"{self.describe(index)} is {type(item).__name__}, not an (image, label) pair")
        return item[0], item[1]

    def _image(self, index: int, image: Any) -> tuple[np.ndarray, bool]:
        """The image as an array, and whether it is encoded."""
        if isinstance(image, (bytes, bytearray, memoryview)):
            return np.frombuffer(image, np.uint8), True
        if hasattr(image, "convert") and hasattr(image, "size"):  # a PIL image
            if self.exif == "apply":
                from PIL import ImageOps

                image = ImageOps.exif_transpose(image)
            return np.asarray(image.convert("RGB")), False
        array = np.asarray(image)
        if array.dtype == np.uint8 and array.ndim == 1:
            return array, True
        if array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3:
            return np.ascontiguousarray(array), False
        raise ValueError(
            f"{self.describe(index)}: the image is {type(image).__name__} of dtype {array.dtype} and shape "
            f"{array.shape}; expected encoded bytes, a PIL image or an HWC uint8 RGB array"
        )


def unwrap_torchvision_dataset(source: Any, transform: Any, target_transform: Any) -> tuple[Any, Any, Any]:
    """A torchvision dataset as a source, and the transforms it carries as the Loader's (``DataLoader(dataset)``).

    ``ImageFolder``/``DatasetFolder`` with torchvision's default loader become its files, in its order, with its
    labels and classes (decoded in the graph as ``pil_loader`` decodes them); any other torchvision dataset (one
    with a custom ``loader=``, CIFAR10, MNIST...) is read through a copy of it with its transforms removed, so that
    its items are the PIL images the transforms would have got. A torch ``Subset`` (``random_split``'s splits too,
    nested or not) of one brings the dataset's transforms and keeps its rows: it becomes one ``Subset`` of the
    unwrapped dataset (:func:`~stallfree.pipeline.subset.subset_rows`). Other sources are returned as they are.

    Raises:
        ValueError: a transform both on the dataset and in ``Loader(transform=...)`` (or ``target_transform``), or
            a joint ``transforms=`` of (image, target), which the graph cannot run; a Subset index out of range.
    """
    inner, rows = subset_rows(source)
    if rows is not None:
        from torch.utils.data import Subset

        opened, transform, target_transform = unwrap_torchvision_dataset(inner, transform, target_transform)
        return (source if opened is inner else Subset(opened, rows.tolist())), transform, target_transform
    if not type(source).__module__.startswith("torchvision.datasets"):
        return source, transform, target_transform
    name = type(source).__name__
    own, own_target = getattr(source, "transform", None), getattr(source, "target_transform", None)
    joint = getattr(source, "transforms", None)
    if joint is not None and own is None and own_target is None:
        raise ValueError(f"{name} has a joint transforms= of (image, target), which the graph cannot run; pass the "
                         "image transform as transform= and the label's as target_transform=")
    for arg, mine, theirs in (("transform", transform, own), ("target_transform", target_transform, own_target)):
        if theirs is not None and mine not in (None, ()):
            raise ValueError(f"{name} has its own {arg} and Loader got {arg}= too: give one of them")
    transform = own if own is not None else transform
    target_transform = own_target if own_target is not None else target_transform
    loader = getattr(source, "loader", None)
    default = getattr(loader, "__module__", "") == "torchvision.datasets.folder" and getattr(
        loader, "__name__", "") in ("default_loader", "pil_loader")
    samples = getattr(source, "samples", None)
    if default and samples is not None:
        paths = [Path(path) for path, _ in samples]
        labels = np.asarray([label for _, label in samples], np.int64)
        return _PathReader(paths, labels, list(source.classes)), transform, target_transform
    bare = copy.copy(source)
    bare.transform = bare.target_transform = bare.transforms = None
    return DatasetReader(bare), transform, target_transform


def open_source(source: str | os.PathLike[str] | Reader | Any, *, exif: Exif = "ignore",
                verify: Verify = "first-use", remote: dict[str, Any] | None = None,
                on_error: Literal["raise", "skip"] = "raise") -> BaseReader:
    """The reader for ``source``, decoding under the Loader's ``exif`` setting (shards checked as ``verify`` says).

    A Reader as it is (a :class:`DatasetReader` as a copy with that setting), WebDataset tars (a path or URL
    ending in ``.tar`` or with a ``{a..b}`` range: a :class:`~stallfree.pipeline.webdataset.WebDatasetReader`
    given the keywords ``remote``), an ingested shard folder, the URL of one (``s3://``, ``gs://``, ``http(s)://``,
    ``file://``: a :class:`~stallfree.pipeline.remote_shards.RemoteShardReader`, or for token shards a
    :class:`~stallfree.pipeline.remote_tokens.RemoteTokenShardReader`, given the keywords ``remote``), a CSV/Parquet
    list, an image folder,
    token sequences (:mod:`~stallfree.pipeline.token_readers`: a token shard folder, a JSON Lines or Parquet file of
    ``input_ids``/``tokens`` or a folder of them, a ``datasets.Dataset`` with ``input_ids``), an image-text shard folder
    (:class:`~stallfree.pipeline.image_text_reader.ImageTextShardReader`), a map-style torch
    Dataset (see :class:`DatasetReader`), or a torch ``Subset`` of any of these (a
    :class:`~stallfree.pipeline.subset.SubsetReader` of its rows).

    ``on_error`` is what a token source read in place does with a bad document (checked when it opens).

    Raises:
        ValueError: ``exif="apply"`` for ``--raw`` shards, whose pixels were decoded at ingest without turning.
    """
    inner, rows = subset_rows(source)
    if rows is not None:
        return SubsetReader(open_source(inner, exif=exif, verify=verify, remote=remote, on_error=on_error), rows)
    if isinstance(source, DatasetReader):
        copied = copy.copy(source)
        copied.exif = exif
        copied.check()
        return copied
    reader = as_reader(source)
    if reader is not None:
        return _check_raw(reader, exif)
    if is_hf_dataset(source):
        return HuggingFaceTokenReader(source, on_error=on_error) if is_token_dataset(source) else \
            HuggingFaceReader(source)
    if not isinstance(source, (str, os.PathLike)):
        dataset = DatasetReader(source)
        dataset.exif = exif
        return dataset
    if is_webdataset(source):
        return WebDatasetReader(source, **(remote or {}))
    if is_url(source):
        remote_reader = open_remote(str(source), **(remote or {}))
        return remote_reader if remote_reader.holds in ("tokens", "image_text") else _check_raw(remote_reader, exif)
    path = Path(source)
    if is_shard_folder(path):
        if is_image_text_folder(path):
            return ImageTextShardReader(path, verify=verify)
        if is_token_folder(path):
            return TokenShardReader(path, verify=verify)
        return _check_raw(ShardReader(path, verify=verify), exif)
    if is_token_source(path):
        return TokenFileReader(path, on_error=on_error)
    if path.suffix.lower() in (".csv", ".parquet"):
        return FileListReader(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset {path} does not exist")
    return FolderReader(path)


def _check_raw(reader: BaseReader, exif: Exif) -> BaseReader:
    if exif == "apply" and reader.shard_rows() is not None and not reader.encoded:
        where = reader.name or type(reader).__name__
        raise ValueError(
            f"exif='apply' but {where} holds --raw shards: their pixels were decoded at ingest without EXIF "
            "orientation, which they no longer carry; ingest without --raw to turn images, or use exif='ignore'"
        )
    return reader
