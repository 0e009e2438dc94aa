"""Batches in memory that both processes map: written by the graph process, taken in place by the training loop.

The graph process writes each batch's images into a slot, the training process takes them in place, and a slot is
written again once the batch on it is freed (:mod:`.process_graph`).

A slot is a memfd, Linux's anonymous shared memory. The graph process makes it and sends its descriptor once over
the connection (``multiprocessing.reduction.send_handle``); both processes map it. Nothing is named in ``/dev/shm``,
so nothing is left behind whichever process dies: a slot goes when the last mapping of it does.

The training process wraps a slot as a torch tensor without copying it. The tensor's storage holds the numpy array
over the mapping; when the last tensor on it is freed (the batch and every view of it dropped), a finalizer hands
the slot's number back (:attr:`Mapped.released`), and it goes to the graph process with the next message. A loop
that keeps its batches (``list(loader)``) only makes the graph process make more slots, as an in-process Loader
allocates a tensor per batch.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Layout", "Mapped", "Slots"]


@dataclass(frozen=True)
class Layout:
    """Where a batch's tensor lies: slot ``slot``'s first ``nbytes``, as ``dtype`` with ``shape`` and ``stride``."""

    slot: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _view(memory: mmap.mmap, layout: Layout) -> tuple[np.ndarray, torch.Tensor]:
    """The bytes of ``layout`` in ``memory`` (what the storage holds), and the tensor over them."""
    raw = np.frombuffer(memory, np.uint8, layout.nbytes)
    dtype = getattr(torch, layout.dtype)
    return raw, torch.from_numpy(raw).view(dtype).as_strided(layout.shape, layout.stride)


class Slots:
    """The graph process's slots: taken for a batch, written, and freed when the training process says so."""

    def __init__(self) -> None:
        self._maps: list[mmap.mmap] = []
        self._free: set[int] = set()
        self._lock = threading.Lock()  # the pumps of two runs (one started ahead) take slots at once

    def put(self, tensor: torch.Tensor) -> tuple[Layout, int | None]:
        """``tensor`` copied into a free slot (a new one if none is large enough).

        Returns its layout, and the new slot's descriptor to send before the layout (``None``: a slot already sent).
        """
        if not (tensor.is_contiguous() or tensor.is_contiguous(memory_format=torch.channels_last)):
            tensor = tensor.contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        new = None
        with self._lock:
            fitting = [slot for slot in self._free if len(self._maps[slot]) >= nbytes]
            if fitting:
                slot = min(fitting, key=lambda s: len(self._maps[s]))
                self._free.discard(slot)
            else:
                slot, new = len(self._maps), os.memfd_create(f"stallfree-batch-{len(self._maps)}")
                os.ftruncate(new, max(nbytes, 1))
                self._maps.append(mmap.mmap(new, max(nbytes, 1)))
            memory = self._maps[slot]
        layout = Layout(slot, nbytes, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tensor.stride())
        _, out = _view(memory, layout)
        out.copy_(tensor)
        return layout, new

    def sent(self, fd: int) -> None:
        """The descriptor ``fd`` reached the training process: the mapping here is all this process keeps."""
        os.close(fd)

    def free(self, slots: list[int]) -> None:
        """The batches on ``slots`` were freed by the training process (or never sent to it)."""
        with self._lock:
            self._free.update(slots)


class Mapped:
    """The training process's slots, mapped as the graph process sends them.

    Attributes:
        released: the numbers of slots whose batches were freed, not yet told to the graph process (appended by
            finalizers, on whichever thread frees a batch).
    """

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}
        self.released: collections.deque[int] = collections.deque()

    def add(self, slot: int, fd: int, size: int) -> None:
        """Map slot ``slot`` from the descriptor ``fd`` received for it (then closed: the mapping keeps it)."""
        try:
            self._maps[slot] = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def tensor(self, layout: Layout) -> torch.Tensor:
        """The batch at ``layout``, in place; its slot is released once the tensor and its views are freed."""
        raw, out = _view(self._maps[layout.slot], layout)
        weakref.finalize(raw, self.released.append, layout.slot)
        return out
