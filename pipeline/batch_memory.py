"""Batches in memory that both processes map: written by the graph process, taken in place by the training loop.

The graph process writes each batch's images into a slot, the training process takes them in place, and a slot is
written again once the batch on it is freed (:mod:`.process_graph`).

A slot is a memfd, Linux's anonymous shared memory. The graph process makes it and sends its descriptor once over
the connection (``multiprocessing.reduction.send_handle``); both processes map it. Nothing is named in ``/dev/shm``,
so nothing is left behind whichever process dies: a slot goes when the last mapping of it does.

The training process wraps a slot as a torch tensor without copying it. The tensor's storage holds a memoryview of
the mapping; when the last tensor on it is freed (the batch and every view of it dropped), a finalizer hands
the slot back on a :class:`Board` the graph process reads before it takes a slot. A loop
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

import torch

__all__ = ["Board", "Layout", "Mapped", "Slots"]

_RUNS = 64  # runs whose taken counts the board holds at once (a run and the next one started ahead are two)
_SLOTS = 4096  # slots whose freeing the board carries; a loop that keeps more batches frees the rest by message
_RUN_BITS = 40  # a count word: the run's id (mod 2**24) above, batches taken below


class Board:
    """Words both processes map, so that the training loop takes a batch without a message or a system call.

    The training process writes, for each run, how many of its batches it has taken (the graph process sends at
    most ``prefetch`` more), and sets a byte when a slot's batch is freed (the graph process writes that slot
    again). Each word is written by one process and read by the other; an aligned 8-byte store is whole on every
    CPU Linux runs on.
    """

    def __init__(self, memory: mmap.mmap):
        self._memory = memory
        self._counts = memoryview(memory)[: _RUNS * 8].cast("q")
        self._freed = memoryview(memory)[_RUNS * 8 :]

    @classmethod
    def create(cls) -> tuple[Board, int]:
        """A new board, and its descriptor to send to the training process."""
        fd = os.memfd_create("stallfree-board")
        os.ftruncate(fd, _RUNS * 8 + _SLOTS)
        return cls(mmap.mmap(fd, _RUNS * 8 + _SLOTS)), fd

    @classmethod
    def attach(cls, fd: int) -> Board:
        """The board whose descriptor ``fd`` was received (then closed: the mapping keeps it)."""
        try:
            return cls(mmap.mmap(fd, _RUNS * 8 + _SLOTS))
        finally:
            os.close(fd)

    def take(self, run_id: int, taken: int) -> None:
        """Run ``run_id``'s first ``taken`` batches are taken (the training process)."""
        self._counts[run_id % _RUNS] = ((run_id % (1 << 24)) << _RUN_BITS) | taken

    def taken(self, run_id: int) -> int | None:
        """How many of run ``run_id``'s batches were taken; ``None`` before the first (the graph process)."""
        word = self._counts[run_id % _RUNS]
        return word & ((1 << _RUN_BITS) - 1) if word >> _RUN_BITS == run_id % (1 << 24) else None

    def free(self, slot: int) -> bool:
        """Slot ``slot``'s batch was freed (the training process); ``False``: past the board, send it instead."""
        if slot >= _SLOTS:
            return False
        self._freed[slot] = 1
        return True

    def freed(self) -> list[int]:
        """The slots freed since the last call (the graph process)."""
        flags, found = self._freed.tobytes(), []
        slot = flags.find(1)
        while slot != -1:
            found.append(slot)
            slot = flags.find(1, slot + 1)
        for slot in found:
            self._freed[slot] = 0
        return found


@dataclass(frozen=True)
class Layout:
    """Where a batch's tensor lies: slot ``slot``'s first ``nbytes``, as ``dtype`` with ``shape`` and ``stride``."""

    slot: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _view(memory: mmap.mmap, layout: Layout) -> tuple[memoryview, torch.Tensor]:
    """The bytes of ``layout`` in ``memory`` (what the tensor's storage holds), and the tensor over them.

    On the training loop's thread, woken from its step with its caches cold beside DALI's workers, making this
    tensor takes about 100 us (8 us in a tight loop), with numpy's four calls as with these two.
    """
    raw = memoryview(memory)[: layout.nbytes]
    dtype = getattr(torch, layout.dtype)
    count = layout.nbytes // dtype.itemsize
    return raw, torch.frombuffer(raw, dtype=dtype, count=count).as_strided(layout.shape, layout.stride)


class Slots:
    """The graph process's slots: taken for a batch, written, and freed when the training process says so."""

    def __init__(self, board: Board) -> None:
        self.board = board
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
            self._free.update(self.board.freed())
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
        released: the numbers of slots past the board's whose batches were freed, not yet told to the graph process
            (appended by finalizers, on whichever thread frees a batch).
    """

    def __init__(self, board: Board) -> None:
        self.board = board
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
        weakref.finalize(raw, self.free, layout.slot)
        return out

    def free(self, slot: int) -> None:
        """Slot ``slot``'s batch was freed (or never delivered): on the board, else with the next message."""
        if not self.board.free(slot):
            self.released.append(slot)
