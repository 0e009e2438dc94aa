"""Parquet written by Hugging Face ``datasets`` (``ds.to_parquet(path)``): which columns are the image and the label.

``datasets`` records each column's feature in the file's schema metadata, under the key ``huggingface``::

    {"info": {"features": {"image": {"_type": "Image"},
                           "label": {"_type": "ClassLabel", "names": ["cat", "dog", ...]}, ...}}}

An ``Image`` column is stored as a struct ``{bytes: binary, path: string}``: ``bytes`` is null where the image was
loaded from a file (``path`` then names it, as it was given: relative, or absolute), and ``path`` may be a bare file
name beside bytes. A ``ClassLabel`` column is an ``int64`` column of class numbers, its class names in the metadata
(``-1``: no label, as in a test split). The rule follows :class:`stallfree.HuggingFaceReader`'s for a
``datasets.Dataset``: the image column is the one ``Image`` feature; the label column the one ``ClassLabel`` feature,
else a column named ``label`` or ``labels``; a ``ClassLabel``'s names are the classes, in its own order (the numbers
the dataset's users already train with).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["EMBED_HINT", "HFColumns", "check_class_labels", "hf_columns"]

#: How a user writes a dataset's images into its Parquet file (as ``push_to_hub`` does) instead of paths to files.
EMBED_HINT = ("write the images into the file: from datasets.table import embed_table_storage; "
              "ds = ds.with_format('arrow').map(embed_table_storage, batched=True).with_format(None); "
              "ds.to_parquet(path)")


@dataclass(frozen=True)
class HFColumns:
    """What a ``datasets``-written file's features say: ``image`` and ``label`` columns, the label's class names.

    ``classes`` is ``None`` where the label column is not a ``ClassLabel`` (its numbers or names decide, as for any
    table).
    """

    image: str
    label: str
    classes: list[str] | None


def _features(schema: Any, where: str) -> dict[str, dict[str, Any]] | None:
    """The ``huggingface`` metadata's features, by column, or ``None`` in a file ``datasets`` did not write."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        features = json.loads(raw)["info"]["features"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{where}: its 'huggingface' schema metadata is not the JSON datasets writes "
                         f"({{'info': {{'features': ...}}}}): {type(err).__name__}: {err}") from None
    if not isinstance(features, dict) or not all(isinstance(f, dict) for f in features.values()):
        raise ValueError(f"{where}: its 'huggingface' metadata's features are not an object of column -> feature")
    return features


def _of_type(features: dict[str, dict[str, Any]], kind: str, columns: list[str]) -> list[str]:
    return [name for name, feature in features.items() if feature.get("_type") == kind and name in columns]


def hf_columns(schema: Any, where: str) -> HFColumns | None:
    """The image and label columns of a Parquet ``schema`` (``pyarrow.Schema``) written by ``datasets``.

    ``None`` where the file has no ``huggingface`` metadata, or no ``Image`` feature (the columns' types decide).

    Raises:
        ValueError: naming ``where``: unreadable metadata; several ``Image`` or ``ClassLabel`` columns and none to
            go by; an ``Image`` column that is not a ``{bytes, path}`` struct; no label column; a ``ClassLabel``
            without class names.
    """
    import pyarrow as pa

    features = _features(schema, where)
    if features is None:
        return None
    columns = list(schema.names)
    images = _of_type(features, "Image", columns)
    if not images:
        return None
    if len(images) > 1:
        raise ValueError(f"{where} holds several Image columns {images}: ingest takes one; drop the others "
                         f"(ds.remove_columns([...])) before ds.to_parquet")
    image = images[0]
    kind = schema.field(image).type
    if not (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0 and kind.get_field_index("path") >= 0):
        raise ValueError(f"{where}: its Image column {image!r} is {kind}, not the struct {{bytes, path}} datasets "
                         "writes")
    labels = _of_type(features, "ClassLabel", columns)
    if len(labels) == 1:
        label = labels[0]
    else:
        named = [name for name in ("label", "labels") if name in columns and name != image]
        if not named:
            what = f"several ClassLabel columns {labels}" if labels else f"no ClassLabel column (it has {columns})"
            raise ValueError(f"{where} has {what} and no column named 'label': rename the one to use "
                             f"(ds.rename_column(name, 'label')) before ds.to_parquet")
        label = named[0]
    classes = None
    if features.get(label, {}).get("_type") == "ClassLabel":
        names = features[label].get("names")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where}: its ClassLabel column {label!r} has no list of class names in the "
                             f"'huggingface' metadata (got {names!r})")
        classes = names
    return HFColumns(image, label, classes)


def check_class_labels(column: Any, classes: list[str], where: str, name: str = "label",
                       unlabeled: bool = False) -> np.ndarray:
    """A ``ClassLabel`` column ``name`` (Arrow integers) as int64 labels, each a number of one of ``classes``.

    ``unlabeled=True`` (the Loader's rule) takes ``-1``, ``datasets``' "no label", as it is; ingest refuses it.

    Raises:
        ValueError: naming ``where`` and the first bad row: an empty cell, ``-1`` (``datasets``' "no label") unless
            ``unlabeled``, another negative number, or a number past the class names.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_integer(column.type):
        raise ValueError(f"{where}: its ClassLabel column holds {column.type}, not class numbers")
    if column.null_count:
        raise ValueError(f"{where} row {pc.index(pc.is_null(column), True).as_py()}: empty label cell")
    labels = column.to_numpy().astype(np.int64)
    bad = ((labels < 0) & ~((labels == -1) & unlabeled)) | (labels >= len(classes))
    if np.any(bad):
        row = int(np.argmax(bad))
        value = int(labels[row])
        why = ("label -1, datasets' 'no label' (a test split?): ingest takes labelled rows; keep them with "
               f"ds.filter(lambda row: row[{name!r}] >= 0)" if value == -1 else
               f"label {value} is not a class number of its ClassLabel's {len(classes)} names")
        raise ValueError(f"{where} row {row}: {why}")
    return labels
