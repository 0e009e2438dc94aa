"""A Loader's passes over its epochs: the pass in progress, where the next one starts, and the state that says so.

Each ``iter(loader)`` is a pass over an epoch (:class:`~stallfree.pipeline.passes.Pass`), one at a time. Where the
Loader stands between passes is :class:`Standing`: the epoch, where its split over ranks starts (elastic resume),
the batcher's cursor, the epoch's skipped samples, and whether a loaded state put it there. Every call that moves it
follows one rule each:

- a pass that delivered a batch and ended (exhausted, failed, dropped, or ended by a newer ``iter()``) moves the
  Loader to the next epoch's start; one that delivered nothing (Lightning's ``iter()`` to check a dataloader)
  leaves it where it was;
- ``set_epoch(e)`` keeps the Loader's place when nothing was delivered since it came to stand there and it stands
  in ``e`` (a loaded state, or a fresh pass: Lightning calls it between ``iter()`` and the first batch); otherwise
  it moves to ``e``'s start, ending a pass that delivered batches (a fresh pass restarts there);
- ``load_state_dict`` moves it where the state says (:mod:`.loader_state`).

The rank is decided when each pass starts (:mod:`.process_group`), so the order of a pass is that of its shard.
"""

from __future__ import annotations

import copy
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stallfree.pipeline.batcher import CountBatcher, Cursor
from stallfree.pipeline.lifecycle import copied, forked
from stallfree.pipeline.loader_state import LoaderState, read_state
from stallfree.pipeline.passes import Pass, Progress
from stallfree.pipeline.run_config import RunConfig, RunParts

if TYPE_CHECKING:
    from stallfree.pipeline.assembly import Assembly
    from stallfree.pipeline.loader_sampler import LoaderOrder, Orders
    from stallfree.pipeline.placement import Placement
    from stallfree.pipeline.reader_base import Reader
    from stallfree.pipeline.run import Clock, Run
    from stallfree.transforms.compile import CompiledTransforms

__all__ = ["STATE_VERSION", "Epochs", "Standing"]

STATE_VERSION = 4  # 4: the stages' parts nested (sampler, batcher), the reader's rejections


@dataclass
class Standing:
    """Where the Loader's next pass starts (or, during a pass, where it started).

    Attributes:
        epoch: the epoch of the pass in progress, else of the next pass.
        start: the batcher's cursor the next pass starts from.
        split: the global position the epoch's split over ranks starts at (elastic resume; else 0).
        skipped: the epoch's skipped samples so far (the list a pass adds to).
        loaded: whether a loaded state put it here; ``raw`` is that state, read again if a pass starts on another
            shard than it was read for (a process group made after ``load_state_dict``).
        shard: the ``(rank, world_size)`` of the pass in progress, else of the loaded state.
    """

    epoch: int = 0
    start: Cursor = field(default_factory=Cursor)
    split: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    loaded: bool = False
    raw: Any = None
    shard: tuple[int, int] = (0, 0)
    planned_world: int | None = None  # a balanced epoch resumed on other ranks: the ranks its packs were planned for

    def at_epoch_start(self, epoch: int) -> None:
        """Stand at ``epoch``'s start, with no loaded state (the ended epoch's skips stay listed until a pass)."""
        self.epoch, self.start, self.split, self.loaded, self.planned_world = epoch, Cursor(), 0, False, None

    def take(self, loaded: LoaderState, shard: tuple[int, int], raw: Any) -> None:
        """Stand where the checked state ``loaded`` (read on ``shard``) says."""
        self.epoch, self.split, self.start, self.skipped = loaded.epoch, loaded.split, loaded.start, loaded.skipped
        self.loaded, self.raw, self.shard, self.planned_world = True, raw, shard, loaded.planned_world


class Epochs:
    """The passes of one Loader (see the module docstring); the Loader's methods are its.

    Args:
        reader: the source's rows.
        orders: the Loader's orders, one per shard.
        batcher: what a batch is.
        compiled: the transforms.
        config: the settings a run reads.
        placement: makes where runs are made (this process, or Ray actors), in each process anew.
        assembly: the batch's public form, for a reader.
        fingerprint: what decides the order and pixels, but the world size.
        clock: where every pass reports its spans (``None``: only a pass given a clock, :meth:`iterate`).

    The callables are picklable (partials of module-level functions and classes): a Loader pickles with its passes.
    """

    def __init__(self, *, reader: Reader, orders: Orders, batcher: CountBatcher, compiled: CompiledTransforms,
                 config: RunConfig, placement: Callable[[], Placement], assembly: Callable[[Reader], Assembly],
                 fingerprint: Callable[[], dict[str, Any]], clock: Clock | None):
        self.reader, self.orders, self.batcher, self.compiled = reader, orders, batcher, compiled
        self.config, self.assembly, self.clock = config, assembly, clock
        self._make_placement, self._fingerprint_of = placement, fingerprint
        self._fingerprint: dict[str, Any] | None = None  # it hashes the source: once
        self.standing = Standing()
        self.local()

    def local(self) -> None:
        """Make what belongs to this process alone anew (a copy's, after pickle, deepcopy or a fork)."""
        self.placement = self._make_placement()
        self._pass: weakref.ref[Pass] | None = None
        self._progress = Progress()  # whether the pass, even once dropped, delivered a batch
        self._discard = weakref.finalize(self, self.placement.discard)
        self.pid = os.getpid()

    # --- where the Loader stands ---

    def current(self) -> Pass | None:
        """The pass in progress; once one that delivered a batch has ended, the next epoch is next."""
        ongoing = self._pass() if self._pass is not None else None
        if (ongoing is None or ongoing.over) and self._pass is not None:
            ongoing, self._pass = None, None
            if self._progress.taken:
                self.standing.at_epoch_start(self.standing.epoch + 1)
        if self.pid != os.getpid():  # a forked child's copy: the parent's pass stays the parent's (lifecycle)
            forked(self, ongoing)
            return None
        return ongoing

    def __getstate__(self) -> dict[str, Any]:
        return copied(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self.local()

    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)`` of the pass in progress, else of a loaded state, else of the process now."""
        return self.standing.shard if self.current() is not None or self.standing.loaded else self.orders.now()

    @property
    def sampler(self) -> LoaderOrder:
        """The order of the pass in progress, else of a loaded state, else of this rank now."""
        return self.order_of(self.shard())

    def order_of(self, shard: tuple[int, int]) -> LoaderOrder:
        """The order of ``shard`` for the epoch the Loader stands in (planned for a resumed state's ranks)."""
        return self.orders[shard].planned_for(self.standing.planned_world)

    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress, or else of the next pass."""
        self.current()
        return self.standing.epoch

    def set_epoch(self, epoch: int) -> None:
        """The one rule of the module docstring."""
        ongoing = self.current()
        if ongoing is not None and ongoing.fresh:
            if epoch != self.standing.epoch:
                self.standing.at_epoch_start(epoch)
                self.standing.skipped.clear()  # the list the pass adds to
                ongoing.restart(*self._run(Cursor()))
            return
        ended = self.end_pass("set_epoch() ended this pass")
        if ended or epoch != self.standing.epoch:
            self.standing.at_epoch_start(epoch)

    def end_pass(self, why: str) -> bool:
        """End the pass in progress, if any (its iterator then raises ``why``); whether there was one."""
        ongoing = self.current()
        if ongoing is None:
            return False
        ongoing.end(why)
        self.current()
        return True

    # --- state ---

    def fingerprint(self, world_size: int | None = None) -> dict[str, Any]:
        """What decides the order and pixels, with the world size (of :meth:`shard` by default)."""
        if self._fingerprint is None:
            self._fingerprint = self._fingerprint_of()
        return {**self._fingerprint, "world_size": self.shard()[1] if world_size is None else world_size}

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered to the caller (:meth:`Loader.state_dict`)."""
        ongoing = self.current()
        return self.state_at(ongoing.cursor if ongoing is not None else self.standing.start, ongoing is not None)

    def state_at(self, cursor: Cursor, in_pass: bool) -> dict[str, Any]:
        """The state standing at ``cursor`` (``in_pass``: the pass's; else the next pass's start)."""
        standing = self.standing
        rank, world_size = standing.shard if in_pass or standing.loaded else self.orders.now()
        return {
            "version": STATE_VERSION,
            "epoch": standing.epoch,
            "rank": rank,  # where it was taken: another rank's state loads too (load_state_dict)
            "fingerprint": self.fingerprint(world_size),
            "sampler": {"split": standing.split, "planned_world": standing.planned_world},
            "batcher": self.batcher.state_dict(cursor),
            "skipped": list(standing.skipped) if in_pass or standing.loaded else [],
            "rejected": [dict(record) for record in self.reader.rejected],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stand where ``state`` says, read for the process's rank now (:meth:`Loader.load_state_dict`)."""
        shard = self.orders.now()
        loaded = self._read(state, shard)
        self.end_pass("load_state_dict() ended this pass")
        self.standing.take(loaded, shard, copy.deepcopy(state))

    def _read(self, state: object, shard: tuple[int, int]) -> LoaderState:
        return read_state(state, version=STATE_VERSION, fingerprint=self.fingerprint(shard[1]),
                          sampler=self.orders[shard], batcher=self.batcher, on_error=self.config.on_error)

    # --- passes ---

    def iterate(self, clock: Clock | None = None) -> Iterator[Any]:
        """A new pass (it ends the one in progress); its runs report to the Loader's clock, or else ``clock``."""
        self.end_pass("a newer iter() started a new pass over the Loader")
        standing, shard = self.standing, self.orders.now()  # the rank is decided now, as a DistributedSampler's
        if standing.loaded and shard != standing.shard:  # the process group came after load_state_dict
            standing.take(self._read(standing.raw, shard), shard, standing.raw)
        standing.shard = shard
        if not standing.loaded:
            standing.skipped = []
        run, cursor = self._run(standing.start)
        self._progress = Progress()
        ongoing = Pass(run, cursor, batcher=self.batcher, assemble=self.assembly(self.reader), skipped=standing.skipped,
                       start_next=self._start_next, progress=self._progress,
                       clock=clock if self.clock is None else self.clock)
        self._pass = weakref.ref(ongoing)
        return ongoing

    def parts(self, shard: tuple[int, int]) -> RunParts:
        """What a run on ``shard`` is made of."""
        return RunParts(self.config, self.order_of(shard).order(), self.reader, self.compiled)

    def _run(self, cursor: Cursor) -> tuple[Run, Cursor]:
        """The run of the current epoch from ``cursor`` (the one started ahead if it fits), and the cursor."""
        standing = self.standing
        run = self.placement.run(self.parts(standing.shard), standing.epoch, standing.split, cursor.position,
                                 self.batcher.number(cursor), standing.skipped)
        return run, cursor

    def _start_next(self, ended: Pass) -> None:
        """``ended``'s run has read its epoch: start the next epoch's run, which ``iter()`` then takes."""
        if self.current() is ended:
            self.placement.start_ahead(self.parts(self.standing.shard), self.standing.epoch + 1)

    def start(self) -> None:
        """Start the coming epoch's run now (:meth:`Loader.start`): only between passes, at an epoch's start."""
        standing = self.standing
        if self.current() is not None or standing.start != Cursor() or standing.split:
            return
        self.placement.start_ahead(self.parts(self.orders.now()), standing.epoch)

    def close(self) -> None:
        """End the pass in progress and stop a run started ahead."""
        self.end_pass("close() ended this pass")
        self.placement.discard()
