"""The fields of a delivered batch beside its images: labels (through ``target_transform``) and ``columns=``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["batch_columns", "batch_labels"]


def batch_labels(loader: Any, rows: np.ndarray) -> Any:
    """The batch's labels on the delivery device, through ``target_transform`` if there is one."""
    labels: Any = torch.from_numpy(np.asarray(loader.labels[rows], np.int64))  # labels.npy may hold int16
    if loader.target_transform is not None:
        from torch.utils.data import default_collate

        labels = default_collate([loader.target_transform(int(label)) for label in loader.labels[rows]])
    if isinstance(labels, torch.Tensor):
        labels = labels.pin_memory() if loader.pin_memory else labels.to(loader.device)
    return labels


def batch_columns(loader: Any, rows: np.ndarray) -> dict[str, Any]:
    """The batch's ``columns=`` fields: numbers as tensors on the delivery device, anything else as a list."""
    out: dict[str, Any] = {}
    for name in loader.columns:
        values: np.ndarray | list[Any]
        if name in loader.reader.columns:
            values = loader.reader.column(name, rows)
        elif name == "index":
            values = np.asarray(rows, np.int64)
        else:  # "path"
            values = [loader.reader.describe(int(row)) for row in rows]
        numeric = isinstance(values, np.ndarray)
        out[name] = torch.from_numpy(np.ascontiguousarray(values)).to(loader.device) if numeric else values
    return out
