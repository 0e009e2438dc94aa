"""The fields of a delivered batch beside its images: labels (through ``target_transform``) and ``columns=``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stallfree.pipeline.reader_base import Reader

__all__ = ["Delivery", "batch_columns", "batch_labels"]


@dataclass(frozen=True, eq=False)
class Delivery:
    """What a delivered batch carries beside its images, and where: the Loader's settings for it.

    ``labels``: every row's label; ``columns``: the ``columns=`` fields, read from ``reader`` (or the built-in
    ``index``/``path``).
    """

    labels: np.ndarray
    reader: Reader
    device: torch.device
    pin_memory: bool = False
    target_transform: Callable[[int], Any] | None = None
    columns: Sequence[str] = ()


def batch_labels(delivery: Delivery, rows: np.ndarray) -> Any:
    """The batch's labels on the delivery device, through ``target_transform`` if there is one."""
    labels: Any = torch.from_numpy(np.asarray(delivery.labels[rows], np.int64))  # labels.npy may hold int16
    if delivery.target_transform is not None:
        from torch.utils.data import default_collate

        labels = default_collate([delivery.target_transform(int(label)) for label in delivery.labels[rows]])
    if isinstance(labels, torch.Tensor):
        labels = labels.pin_memory() if delivery.pin_memory else _to(labels, delivery.device)
    return labels


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; on the CPU already, no call into torch at all.

    Every call that releases the GIL makes the training loop take it back, and while the Loader's reader thread runs
    Python that waits up to the interpreter's switch interval (5 ms): a ``.to("cpu")`` that does nothing cost the
    loop 0.9 ms a batch on average (issue 36's hand-off).
    """
    return tensor if device.type == "cpu" else tensor.to(device)


def batch_columns(delivery: Delivery, rows: np.ndarray) -> dict[str, Any]:
    """The batch's ``columns=`` fields: numbers as tensors on the delivery device, anything else as a list."""
    out: dict[str, Any] = {}
    reader = delivery.reader
    for name in delivery.columns:
        values: np.ndarray | list[Any]
        if name in reader.columns:
            values = reader.column(name, rows)
        elif name == "index":
            values = np.asarray(rows, np.int64)
        else:  # "path"
            values = [reader.describe(int(row)) for row in rows]
        numeric = isinstance(values, np.ndarray)
        out[name] = _to(torch.from_numpy(np.ascontiguousarray(values)), delivery.device) if numeric else values
    return out
