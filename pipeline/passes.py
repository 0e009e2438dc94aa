"""The iterator of one pass over a Loader: its batches in order, each yielded ``echo`` times in batch mode.

It keeps the cursor a checkpoint holds (after the last batch *delivered*, never one prefetched), and once its pass
ends (exhausted, failed, dropped, or ended by a newer ``iter()``) its ``next`` raises instead of changing the Loader.
Whether ``next`` was ever called on it outlives the iterator (:class:`Progress`): a pass dropped before its first
``next`` (Lightning's ``iter()`` that checks a dataloader is iterable) leaves the Loader's epoch where it was.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stallfree.pipeline.assembly import Assembly
    from stallfree.pipeline.batcher import Batcher, Cursor
    from stallfree.pipeline.run import Clock, Run
    from stallfree.pipeline.samples import Batch

__all__ = ["Pass", "Progress"]


@dataclass
class Progress:
    """What the Loader knows of its pass once the iterator may be gone: whether ``next`` was called on it."""

    taken: bool = False


class Pass:
    """The iterator of one pass: batches from an :class:`Run`, each yielded ``echo`` times in batch mode.

    Args:
        run: the epoch run it takes batches from.
        cursor: where the pass starts.
        batcher: what a batch is; it moves the cursor after each delivery (each batch is delivered its ``echo``
            times).
        assemble: the batch's public form from its fields (:mod:`.assembly`).
        skipped: the list each batch's skipped samples are added to (the Loader's ``skipped``).
        start_next: called once with this pass when its run may start the next epoch's run (its reader has read
            the epoch: the next run's reads overlap this one's last batches in the graph).
        progress: set when ``next`` is first called.
        clock: where its runs report their spans (:meth:`Run.attach`), or ``None``.
    """

    def __init__(self, run: Run, cursor: Cursor, *, batcher: Batcher, assemble: Assembly,
                 skipped: list[dict[str, Any]], start_next: Callable[[Pass], None], progress: Progress,
                 clock: Clock | None = None):
        self.batcher, self.assemble, self.progress, self.clock = batcher, assemble, progress, clock
        self._skipped, self._start_next = skipped, start_next
        self._pid = os.getpid()  # its threads are this process's: a forked child has none of them
        self.over = False
        self._why: str | None = None
        self._begin(run, cursor)

    def _begin(self, run: Run, cursor: Cursor) -> None:
        run.attach(self.clock)
        self.run, self.cursor, self.fresh = run, cursor, True  # fresh: no batch taken from this iterator yet
        self._batches = iter(run)
        self._batch: tuple[Batch, Any] | None = None
        self._next_started = False
        weakref.finalize(self, run.stop)  # a dropped iterator stops its threads

    def restart(self, run: Run, cursor: Cursor) -> None:
        """Take batches from ``run`` instead, starting at ``cursor``: only while :attr:`fresh` (nothing taken yet).

        As a DataLoader iterator's order is drawn on its first ``next``, ``set_epoch`` between ``iter()`` and the
        first batch (Lightning's fit loop does it) chooses this pass's epoch.
        """
        if not self.fresh:
            raise RuntimeError("a pass that has delivered a batch cannot be restarted")
        self.run.stop()
        self._begin(run, cursor)

    def end(self, why: str) -> None:
        """End this pass from outside: its threads stop and its next ``next`` raises."""
        self.over, self._why = True, why
        self.run.stop()

    def __iter__(self) -> Pass:
        return self

    def __next__(self) -> Any:
        if self._pid != os.getpid():
            raise RuntimeError(f"this Loader iterator's pass runs in process {self._pid}, and this is process "
                               f"{os.getpid()}, a fork of it: its threads did not come with the fork; iterate the "
                               "Loader again (`for batch in loader`) to go on from its last batch delivered")
        if self._why is not None:
            raise RuntimeError(f"this Loader iterator's pass is over: {self._why}; iterate the Loader again "
                               "(`for batch in loader`) to go on")
        if self.over:
            raise StopIteration
        self.fresh, self.progress.taken = False, True
        if self._batch is None or self.cursor.repeat == 0:  # the batch before was delivered its last time
            try:
                batch = next(self._batches)
            except BaseException:  # exhausted or failed: either way this pass is over
                self.over = True
                self.run.stop()
                raise
            self._skipped.extend(batch.skipped)
            if not self._next_started and self.run.may_start_next.is_set():
                self._next_started = True
                self._start_next(self)
            self._batch = batch, self.assemble(batch)
        batch, out = self._batch
        self.cursor = self.batcher.after(self.cursor, batch.start, batch.end)
        return out
