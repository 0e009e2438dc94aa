"""torch's ``Subset`` as a source: the rows its indices pick from the dataset it wraps, nested Subsets composed.

``Subset(dataset, indices)`` and ``random_split(dataset, ...)`` (which returns Subsets) are how a DataLoader user
splits a dataset; a DataLoader reads ``dataset[indices[i]]``. The Loader does the same without calling the Subset:
:func:`subset_rows` finds the dataset under any number of Subsets and the rows of it they pick, the dataset is
opened as any source is (a torchvision ``ImageFolder`` as its files, with its transforms), and a
:class:`SubsetReader` reads those rows of it, in the Subset's order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from stallfree.pipeline.reader_base import BaseReader, Sample

__all__ = ["SubsetReader", "subset_rows"]


def _name(dataset: Any) -> str:
    return type(dataset).__name__


def subset_rows(source: Any) -> tuple[Any, np.ndarray | None]:
    """The dataset under ``source``'s Subsets and the rows of it they pick, in order; ``(source, None)`` if none.

    ``Subset(Subset(d, a), b)`` picks ``d``'s rows ``a[b]``, as reading it item by item would.

    Raises:
        ValueError: an index that is not a whole number in ``0 .. len(dataset) - 1`` (a negative one too: it would
            count from the end only where the dataset happens to be a list), named with its position; no indices.
    """
    from torch.utils.data import Subset

    rows: np.ndarray | None = None
    while isinstance(source, Subset):
        inner: Any = source.dataset
        picked = np.asarray(source.indices)
        where = f"Subset of {_name(inner)}"
        if picked.ndim != 1 or (picked.size and picked.dtype.kind not in "iu"):
            raise ValueError(f"{where}: its indices must be a sequence of whole numbers, got {picked.dtype} of shape "
                             f"{picked.shape}")
        picked = picked.astype(np.int64)
        size = len(inner)
        outside = (picked < 0) | (picked >= size)
        if np.any(outside):
            position = int(np.argmax(outside))
            raise ValueError(f"{where}: index {int(picked[position])} at position {position} is outside 0 .. "
                             f"{size - 1}, the rows of the {size}-item dataset it wraps")
        rows = picked if rows is None else picked[rows]  # the outer Subset's rows are positions in this one's
        source = inner
    if rows is not None and len(rows) == 0:
        raise ValueError(f"the Subset of {_name(source)} picks no rows (empty indices): there is nothing to load")
    return source, rows


class SubsetReader(BaseReader):
    """Rows ``rows`` of ``inner``, in that order: row ``i`` is ``inner``'s row ``rows[i]``.

    Its classes are the inner source's (a Subset of an ImageFolder keeps all its classes, as ``dataset.classes``
    does); ``describe`` names the inner row (its file), and ``columns=["index"]`` gives the row in the Subset.
    """

    def __init__(self, inner: BaseReader, rows: np.ndarray):
        super().__init__()
        self.inner, self.rows = inner, np.asarray(rows, np.int64)
        self.classes, self.encoded, self.columns = list(inner.classes), bool(inner.encoded), tuple(inner.columns)
        self.name = f"Subset of {inner.name or inner.kind}"
        self._labels = np.asarray(inner.labels())[self.rows]

    @property
    def kind(self) -> str:
        return f"Subset of {self.inner.kind}"

    def __len__(self) -> int:
        return len(self.rows)

    def labels(self) -> np.ndarray:
        return self._labels

    def read(self, index: int) -> Sample:
        return self.inner.read(int(self.rows[index]))

    def describe(self, index: int) -> str:
        return self.inner.describe(int(self.rows[index]))

    def column(self, name: str, rows: np.ndarray) -> np.ndarray | list[Any]:
        return self.inner.column(name, self.rows[rows])

    def fingerprint(self) -> str:
        """The inner source's identity and the rows picked: another split of the same data is other data."""
        digest = hashlib.sha256(f"Subset:{self.inner.fingerprint()}:".encode())
        digest.update(self.rows.tobytes())
        return digest.hexdigest()

    def shard_rows(self) -> Sequence[int] | None:
        """None: picked rows do not keep the inner source's shards whole, so ``shuffle="block"`` has none to go by."""
        return None

    def follow(self, rows: np.ndarray) -> None:
        self.inner.follow(self.rows[rows])

    def close(self) -> None:
        self.inner.close()
