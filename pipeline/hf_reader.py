"""A Hugging Face ``datasets.Dataset`` as a source: its encoded images read from Arrow, never decoded in Python.

``Loader(ds, ...)`` opens a :class:`HuggingFaceReader` for a ``datasets.Dataset`` (recognised by its type's module,
so nothing here imports ``datasets``). The image column is the one whose feature is ``Image`` and the label column
the one whose feature is ``ClassLabel`` (its names are the classes), else an integer column named ``label`` or
``labels``; name them with ``HuggingFaceReader(ds, image=..., label=...)`` where there are several or none. An
``Image`` column is stored as a struct ``{bytes, path}``: the bytes go to the graph as they are (decoded there,
like files), and a row without bytes is read from its ``path``. The dataset's own row order (after ``shuffle`` or
``select``) is the source's row order; the Loader's sampler orders the rows as for any source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stallfree.ingest.labels import class_numbers, label_array
from stallfree.pipeline.reader_base import BaseReader, identity

__all__ = ["HuggingFaceReader", "is_hf_dataset"]


def is_hf_dataset(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face ``datasets`` dataset (map-style or iterable), by its type's module."""
    return type(obj).__module__.startswith("datasets.") and type(obj).__name__ in ("Dataset", "IterableDataset")


def _columns_of(features: dict[str, Any], kind: str) -> list[str]:
    return [name for name, feature in features.items() if type(feature).__name__ == kind]


class HuggingFaceReader(BaseReader):
    """Rows of a Hugging Face ``datasets.Dataset`` with an ``Image`` column and an integer label.

    Args:
        dataset: a map-style ``datasets.Dataset``.
        image: the image column (default: the one ``Image`` feature).
        label: the label column (default: the one ``ClassLabel`` feature, else ``label`` or ``labels``).

    Raises:
        TypeError: an ``IterableDataset`` (streamed: no random access), or the image column is not an ``Image``
            feature of encoded bytes.
        ValueError: no image or label column to go by, or several (named, with the keyword to choose); an empty
            dataset; a label that is not a class number (naming the row, as for every source).
    """

    def __init__(self, dataset: Any, image: str | None = None, label: str | None = None):
        super().__init__()
        kind = type(dataset).__name__
        if kind == "IterableDataset":
            raise TypeError("a streamed datasets.IterableDataset has no random access, which the Loader's exactly-once "
                            "order needs: load it map-style (load_dataset(..., streaming=False)), or write it with "
                            "ds.to_parquet(path) and `stallfree ingest path out/`")
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
        self._labels = label_array(table.column(self.label).to_numpy(zero_copy_only=False), self.name, unit="row")
        names = getattr(features[self.label], "names", None)
        self.classes = list(names) if names else class_numbers(self._labels)

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

    def read(self, index: int) -> np.ndarray:
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
