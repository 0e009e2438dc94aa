"""``loader.sampler``: the Loader's :class:`~stallfree.pipeline.sampler.Sampler`, with DistributedSampler's set_epoch.

Lightning's fit loop (and many hand-written loops) call ``loader.sampler.set_epoch(epoch)`` before each epoch, as
``DistributedSampler`` needs. Here that sets the Loader's epoch (:meth:`Loader.set_epoch`), so the loop that drives
the epoch and the Loader agree: calling it each epoch changes nothing (the Loader advances by itself after a pass),
and after ``load_state_dict`` setting the state's epoch keeps its position, so a resumed run stays bit-identical.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, fields
from typing import Protocol

from stallfree.pipeline.sampler import Sampler

__all__ = ["LoaderSampler"]


class _Epochs(Protocol):
    @property
    def epoch(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...


@dataclass(frozen=True)
class LoaderSampler(Sampler):
    """A :class:`Sampler` whose :meth:`set_epoch` and :attr:`epoch` are its Loader's (held weakly: no cycle).

    Args:
        owner: a weak reference to the Loader.
    """

    owner: weakref.ReferenceType[_Epochs] | None = field(default=None, compare=False, repr=False)

    def order(self) -> Sampler:
        """The order alone, without its Loader: what an epoch run uses, picklable (a weak reference is not)."""
        return Sampler(**{f.name: getattr(self, f.name) for f in fields(Sampler)})

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
