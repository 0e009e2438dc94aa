"""The one resume contract every stateful part keeps: the Loader, the trainer's feeds, MixUp and CutMix.

A part that is :class:`Resumable` promises:

1. ``state_dict()`` is JSON-serialisable and says where the part stands: after the last batch *delivered to the
   caller* (never one prefetched), plus a ``"fingerprint"`` of what decides the order and the pixels.
2. A new part built with the same configuration (thread, prefetch and worker counts may differ) continues, after
   ``load_state_dict(state)``, with the batch after that one, bit-identically.
3. ``set_epoch(e)`` with ``e`` the epoch of a loaded state keeps the loaded position; any other ``e`` starts
   epoch ``e`` at its first batch.
4. Once a pass has run to its end, the state is the start of the next epoch, where ``iter()`` goes on.
5. ``load_state_dict`` refuses a state taken with another fingerprint: a ``ValueError`` names the field.

``tests/test_resume_contract.py`` checks every part against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Resumable", "check_fingerprint"]


@runtime_checkable
class Resumable(Protocol):
    """A stateful part of the input path that resumes exactly (the contract is this module's docstring)."""

    def state_dict(self) -> dict[str, Any]:
        """Where the part stands, JSON-serialisable, with its ``"fingerprint"``."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the last batch delivered when ``state`` was taken."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` next (keeping a loaded position in that epoch)."""
        ...


def check_fingerprint(owner: str, theirs: Mapping[str, Any] | None, mine: Mapping[str, Any]) -> None:
    """Refuse a state whose fingerprint differs from ``mine``.

    Raises:
        ValueError: naming the first field that differs, or saying the state has no fingerprint.
    """
    if theirs is None:
        raise ValueError(f"{owner} state has no fingerprint (it predates the resume contract, or is not a "
                         f"{owner} state); start the epoch again")
    for key, value in mine.items():
        if theirs.get(key) != value:
            raise ValueError(f"{owner} state has {key}={theirs.get(key)!r} but this {owner} has {key}={value!r}; "
                             "resume with the configuration and data the state was taken with")
