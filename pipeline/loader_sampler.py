"""``loader.sampler``: the Loader's :class:`~stallfree.pipeline.sampler.Sampler`, with DistributedSampler's set_epoch.

Lightning's fit loop (and many hand-written loops) call ``loader.sampler.set_epoch(epoch)`` before each epoch, as
``DistributedSampler`` needs. Here that sets the Loader's epoch (:meth:`Loader.set_epoch`), so the loop that drives
the epoch and the Loader agree: calling it each epoch changes nothing (the Loader advances by itself after a pass),
and after ``load_state_dict`` setting the state's epoch keeps its position, so a resumed run stays bit-identical.

A Loader has one order per ``(rank, world_size)`` it has run on (:class:`Orders`): its rank is decided when each
pass starts (:mod:`~stallfree.pipeline.process_group`), so ``loader.sampler`` is the order of the pass in progress,
else of a loaded state, else of the process's rank now.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from stallfree.pipeline.packing import PackOrder
from stallfree.pipeline.process_group import process_shard
from stallfree.pipeline.sampler import Sampler

__all__ = ["LoaderOrder", "LoaderPacks", "LoaderSampler", "Orders"]


class _Epochs(Protocol):
    @property
    def epoch(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...


class _Owned:
    """An order whose :meth:`set_epoch` and :attr:`epoch` are its Loader's (held weakly: no cycle)."""

    owner: weakref.ReferenceType[_Epochs] | None

    def _loader(self) -> _Epochs:
        loader = self.owner() if self.owner is not None else None
        if loader is None:
            raise RuntimeError("this sampler's Loader no longer exists; call set_epoch on a live Loader's sampler")
        return loader

    @property
    def epoch(self) -> int:
        """The Loader's epoch: that of the pass in progress, or else of the next pass."""
        return self._loader().epoch

    def set_epoch(self, epoch: int) -> None:
        """As ``DistributedSampler.set_epoch``: the next pass uses ``epoch``'s order and augmentation.

        It is :meth:`Loader.set_epoch`: it ends a pass in progress, and setting the epoch a loaded state is in keeps
        the state's position.
        """
        self._loader().set_epoch(epoch)


@dataclass(frozen=True)
class LoaderSampler(_Owned, Sampler):
    """A :class:`Sampler` whose :meth:`set_epoch` and :attr:`epoch` are its Loader's.

    Args:
        owner: a weak reference to the Loader.
    """

    owner: weakref.ReferenceType[_Epochs] | None = field(default=None, compare=False, repr=False)

    def order(self) -> Sampler:
        """The order alone, without its Loader: what an epoch run uses, picklable (a weak reference is not)."""
        return Sampler(**{f.name: getattr(self, f.name) for f in fields(Sampler)})

    def planned_for(self, world_size: int | None) -> LoaderSampler:
        """Itself (a sampler's order does not depend on the world size)."""
        return self


@dataclass(frozen=True)
class LoaderPacks(_Owned, PackOrder):
    """A :class:`PackOrder` whose :meth:`set_epoch` and :attr:`epoch` are its Loader's."""

    owner: weakref.ReferenceType[_Epochs] | None = field(default=None, compare=False, repr=False)

    def order(self) -> PackOrder:
        """The packs alone, without their Loader (picklable), sharing the plans made so far."""
        return PackOrder(**{f.name: getattr(self, f.name) for f in fields(PackOrder)})

    def planned_for(self, world_size: int | None) -> LoaderPacks:
        """As :meth:`PackOrder.planned_for`, keeping the Loader."""
        planned = PackOrder.planned_for(self, world_size)
        return planned if isinstance(planned, LoaderPacks) else self


#: An order a Loader makes for a shard: of samples, or of packs of documents.
LoaderOrder = LoaderSampler | LoaderPacks


class Orders:
    """A Loader's orders, one per ``(rank, world_size)``, each made on first use from the same settings.

    Args:
        owner: the Loader (held weakly).
        rank, world_size: the Loader's arguments (``None``: the process's, :func:`process_shard`).
        make: makes the order of a shard from ``rank``, ``world_size`` and ``owner`` (a partial of
            :class:`LoaderSampler` or :class:`LoaderPacks` with their other fields: picklable).
    """

    def __init__(self, owner: _Epochs, rank: int | None, world_size: int | None,
                 make: Callable[..., LoaderOrder]):
        self.arguments, self.make = (rank, world_size), make
        self.bind(owner)

    def bind(self, owner: _Epochs) -> None:
        """Make the orders for ``owner`` (a copy of the Loader, after pickling)."""
        self._owner = weakref.ref(owner)
        self._made: dict[tuple[int, int], LoaderOrder] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"arguments": self.arguments, "make": self.make}  # the owner is bound where it lands

    def now(self) -> tuple[int, int]:
        """This process's ``(rank, world_size)`` now (the arguments win)."""
        return process_shard(*self.arguments)

    def __getitem__(self, shard: tuple[int, int]) -> LoaderOrder:
        """The order of rank ``shard[0]`` of ``shard[1]``."""
        order = self._made.get(shard)
        if order is None:
            order = self._made[shard] = self.make(rank=shard[0], world_size=shard[1], owner=self._owner)
        return order
