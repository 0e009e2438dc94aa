"""The hand-off's last step: a batch's fields assembled into the form the training loop takes, one per sample kind.

The stages carry a batch as fields by name (:class:`~stallfree.pipeline.samples.Batch`); an assembly adds the column
fields (read for the batch's rows, never with a sample) and returns the kind's public form. The image kind's is
DataLoader's ``(images, labels)``, or ``(images, labels, columns)`` with ``columns=`` (:class:`ImageAssembly`). A new
sample kind brings its own assembly here (DESIGN.md, "Sample kinds").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from stallfree.ingest.fields import IMAGE
from stallfree.pipeline.reader_base import Reader
from stallfree.pipeline.samples import Batch

__all__ = ["Assembly", "ImageAssembly", "TokenAssembly", "batch_columns", "batch_labels"]


class Assembly(Protocol):
    """A batch's fields in the public form of its sample kind."""

    def __call__(self, batch: Batch) -> Any:
        """The training loop's batch."""
        ...


@dataclass(frozen=True, eq=False)
class ImageAssembly:
    """The image kind's batch: ``(images, labels)``, with ``(..., columns)`` when ``columns`` are asked for.

    ``labels``: every row's label; ``columns``: the ``columns=`` fields, read from ``reader`` (or the built-in
    ``index``/``path``).
    """

    reader: Reader
    labels: np.ndarray
    device: torch.device
    pin_memory: bool = False
    target_transform: Callable[[int], Any] | None = None
    columns: Sequence[str] = ()

    def __call__(self, batch: Batch) -> tuple[Any, ...]:
        out: tuple[Any, ...] = (batch.fields[IMAGE.name], batch_labels(self, batch.rows))
        return (*out, batch_columns(self.reader, self.columns, self.device, batch.rows)) if self.columns else out


def batch_labels(delivery: ImageAssembly, rows: np.ndarray) -> Any:
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


def batch_columns(reader: Reader, columns: Sequence[str], device: torch.device, rows: np.ndarray) -> dict[str, Any]:
    """The ``columns`` of ``rows``: numbers as tensors on ``device``, anything else as a list."""
    out: dict[str, Any] = {}
    for name in columns:
        values: np.ndarray | list[Any]
        if name in reader.columns:
            values = reader.column(name, rows)
        elif name == "index":
            values = np.asarray(rows, np.int64)
        else:  # "path"
            values = [reader.describe(int(row)) for row in rows]
        numeric = isinstance(values, np.ndarray)
        out[name] = _to(torch.from_numpy(np.ascontiguousarray(values)), device) if numeric else values
    return out


@dataclass(frozen=True, eq=False)
class TokenAssembly:
    """The token kinds' batch: a dict of its fields (``input_ids``, ``labels``, ...), tensors on ``device``.

    The token run assembled the arrays in its own thread (:mod:`.token_run`); here they only move where they go.
    With ``columns``, ``batch["columns"]`` holds them for each of the batch's documents in the order of its segments
    (a packed batch's ``cu_seqlens`` without its padding; a padded batch's rows): a document split over rows has an
    entry for each piece.
    """

    reader: Reader
    device: torch.device
    pin_memory: bool = False
    columns: Sequence[str] = ()

    def __call__(self, batch: Batch) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in batch.fields.items():
            if isinstance(value, torch.Tensor):
                value = value.pin_memory() if self.pin_memory else _to(value, self.device)
            out[name] = value
        if self.columns:
            out["columns"] = batch_columns(self.reader, self.columns, self.device, batch.rows)
        return out
