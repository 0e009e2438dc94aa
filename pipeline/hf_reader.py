"""A Hugging Face ``datasets.Dataset`` as a source: its encoded images read from Arrow, never decoded in Python.

``Loader(ds, ...)`` opens a :class:`HuggingFaceReader` for a ``datasets.Dataset`` (recognised by its type's module,
so nothing here imports ``datasets``). The image column is the one whose feature is ``Image`` and the label column
the one whose feature is ``ClassLabel`` (its names are the classes), else a column named ``label`` or ``labels``;
name them with ``HuggingFaceReader(ds, image=..., label=...)`` where there are several or none. An ``Image`` column
is stored as a struct ``{bytes, path}``: the bytes go to the graph as they are (decoded there, like files), and a row
without bytes is read from its ``path``. The dataset's own row order (after ``shuffle`` or ``select``) is the
source's row order; the Loader's sampler orders the rows as for any source.

Labels follow the rule of every table (:func:`stallfree.ingest.labels.label_column`): whole numbers are class
numbers, strings are class names (numbered in sorted order, as ImageFolder numbers its folders). A ``ClassLabel``'s
``-1`` is ``datasets``' "no label" (a test split's): it is loaded as it is, each such row's label ``-1`` in the batch
(what a DataLoader over the dataset gives), with a warning that counts the rows.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.ingest.hf_parquet import check_class_labels
from stallfree.ingest.labels import label_column
from stallfree.pipeline.reader_base import BaseReader, Sample, identity

__all__ = ["HuggingFaceReader", "is_hf_dataset"]

_KINDS = ("Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict")


def is_hf_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face ``datasets`` dataset (map-style or iterable, or a dict of splits)."""
    return type(obj).__module__.startswith("datasets.") and type(obj).__name__ in _KINDS


def _refuse_unreadable(dataset: Any) -> None:
    """A dict of splits, a streamed dataset or one with a Python transform, each refused by name with the fix."""
    kind = type(dataset).__name__
    if kind.endswith("DatasetDict"):
        splits = list(dataset)
        example = repr(splits[0]) if splits else "'train'"
        raise TypeError(f"a datasets.{kind} holds the splits {splits}, not one dataset: pass the split to load, as "
                        f"in Loader(ds[{example}], ...)")
    if kind == "IterableDataset":
        raise TypeError("a streamed datasets.IterableDataset has no random access, which the Loader's exactly-once "
                        "order needs: load it map-style (load_dataset(..., streaming=False)), or write it with "
                        "ds.to_parquet(path) and `stallfree ingest path out/`")
    form = getattr(dataset, "format", None) or {}
    if form.get("type") == "custom":  # ds.with_transform(fn) / ds.set_transform(fn)
        fn = form.get("format_kwargs", {}).get("transform")
        name = getattr(fn, "__qualname__", None) or repr(fn)
        raise TypeError(
            f"the datasets.Dataset has a transform {name} (ds.with_transform / ds.set_transform), which the Loader "
            "would not run: it reads the encoded images from Arrow and decodes and augments them in its graph. Give "
            "the augmentation as Loader(ds, transform=...) (stallfree.transforms, or torchvision's transforms) and "
            "pass the dataset without its transform: the one before with_transform, or ds.reset_format() after "
            "set_transform"
        )


def _columns_of(features: dict[str, Any], kind: str) -> list[str]:
    return [name for name, feature in features.items() if type(feature).__name__ == kind]


class HuggingFaceReader(BaseReader):
    """Rows of a Hugging Face ``datasets.Dataset`` with an ``Image`` column and a label column.

    Args:
        dataset: a map-style ``datasets.Dataset`` (one split: ``ds["train"]`` of a ``DatasetDict``).
        image: the image column (default: the one ``Image`` feature).
        label: the label column (default: the one ``ClassLabel`` feature, else ``label`` or ``labels``), of class
            numbers or class names (see the module's docstring).

    Raises:
        TypeError: an ``IterableDataset`` (streamed: no random access), a ``DatasetDict`` (naming its splits: pass
            one, ``ds["train"]``), a dataset with a Python transform (``with_transform``/``set_transform``: pass it
            as the Loader's ``transform=`` instead), or the image column is not an ``Image`` feature.
        ValueError: no image or label column to go by, or several (named, with the keyword to choose); an empty
            dataset; a label that is neither a class name nor a class number (naming the row, as for every source).

    Warns:
        UserWarning: rows whose ``ClassLabel`` is ``-1`` (no label), counted; they are loaded with label ``-1``.
    """

    def __init__(self, dataset: Any, image: str | None = None, label: str | None = None):
        super().__init__()
        _refuse_unreadable(dataset)
        features = dict(dataset.features)
        self.image = image or self._one(features, "Image", "image", "image=")
        self.label = label or self._label(features)
        for arg, name in (("image", self.image), ("label", self.label)):
            if name not in features:
                raise ValueError(f"{arg}={name!r} is not a column of this dataset; it has {list(features)}")
        if type(features[self.image]).__name__ != "Image":
            raise TypeError(f"column {self.image!r} is {features[self.image]!r}, not an Image feature: the Loader "
                            "reads encoded images (cast it with ds.cast_column(name, datasets.Image()))")
        if len(dataset) == 0:
            raise ValueError("the datasets.Dataset is empty")
        table = dataset.with_format("arrow")[:]  # a pyarrow Table in the dataset's row order (indices applied)
        pictures = table.column(self.image).combine_chunks()
        self._bytes, self._paths = pictures.field("bytes"), pictures.field("path")
        self.name = f"datasets.Dataset:{getattr(dataset, '_fingerprint', '')}"
        self._labels, self.classes = self._read_labels(table.column(self.label), features[self.label])

    def _read_labels(self, column: Any, feature: Any) -> tuple[np.ndarray, list[str]]:
        """Every row's label and the classes: a ClassLabel's numbers (``-1`` kept) and names, else the table rule."""
        names = getattr(feature, "names", None)
        if type(feature).__name__ != "ClassLabel" or not names:
            return label_column(column, f"{self.name} column {self.label!r}")
        labels = check_class_labels(column, list(names), self.name, self.label, unlabeled=True)
        missing = int(np.count_nonzero(labels == -1))
        if missing:
            which = "every row" if missing == len(labels) else f"{missing} of {len(labels)} rows"
            warnings.warn(
                f"{self.name}: ClassLabel column {self.label!r} is -1, datasets' 'no label', in {which} (an "
                "unlabeled split, as a test split often is): they are loaded, and their label in each batch is -1; "
                f"to keep the labelled rows only, ds.filter(lambda row: row[{self.label!r}] >= 0)",
                UserWarning, stacklevel=2)
        return labels, list(names)

    @staticmethod
    def _one(features: dict[str, Any], kind: str, default: str, keyword: str) -> str:
        found = _columns_of(features, kind)
        if len(found) == 1:
            return found[0]
        if not found and default in features:
            return default
        what = f"several {kind} columns {found}" if found else f"no {kind} column (it has {list(features)})"
        raise ValueError(f"the datasets.Dataset has {what}: name the one to use, as in "
                         f"Loader(stallfree.HuggingFaceReader(ds, {keyword}'...'), ...)")

    def _label(self, features: dict[str, Any]) -> str:
        if _columns_of(features, "ClassLabel"):
            return self._one(features, "ClassLabel", "label", "label=")
        for name in ("label", "labels"):
            if name in features:
                return name
        return self._one(features, "ClassLabel", "label", "label=")

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self) -> np.ndarray:
        return self._labels

    def read(self, index: int) -> Sample:
        """Row ``index``'s fields: ``{"image": ...}`` (:meth:`read_image`)."""
        return {"image": self.read_image(index)}

    def read_image(self, index: int) -> np.ndarray:
        """Row ``index``'s encoded image: its bytes from Arrow (no copy), else the file at its ``path``.

        Raises:
            ValueError: the row has neither bytes nor a path.
            OSError: its path cannot be read.
        """
        if self._bytes[index].is_valid:
            return np.frombuffer(self._bytes[index].as_buffer(), np.uint8)
        path = self._paths[index].as_py()
        if not path:
            raise ValueError(f"{self.describe(index)}: the image has neither bytes nor a path")
        return np.frombuffer(Path(path).read_bytes(), np.uint8)

    def describe(self, index: int) -> str:
        path = self._paths[index].as_py()
        return f"{self.name}[{index}]" + (f" ({path})" if path else "")

    def fingerprint(self) -> str:
        """The dataset's own fingerprint (Hugging Face's hash of its data and transforms) with the labels."""
        return identity(type(self).__qualname__, self.name, self._labels)
