"""The one resume contract every stateful part keeps: the Loader, the trainer's feeds, MixUp and CutMix.

A part that is :class:`Resumable` promises:

1. ``state_dict()`` is JSON-serialisable and says where the part stands: after the last batch *delivered to the
   caller* (never one prefetched), plus a ``"fingerprint"`` of what decides the order and the pixels.
2. A new part built with the same configuration (thread, prefetch and worker counts may differ) continues, after
   ``load_state_dict(state)``, with the batch after that one, bit-identically.
3. ``set_epoch(e)`` with ``e`` the epoch of a loaded state keeps the loaded position; any other ``e`` starts
   epoch ``e`` at its first batch.
4. Once a pass has run to its end, the state is the start of the next epoch, where ``iter()`` goes on.
5. ``load_state_dict`` refuses a state taken with another fingerprint, and a state that is not one the part could
   have taken (a field missing, of another type, or out of range): a ``ValueError`` names the field and its value,
   when the state loads, never later at iteration.

``tests/test_resume_contract.py`` checks every part against it.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Resumable", "check_fingerprint", "state_int", "state_mapping"]


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
    if not isinstance(theirs, Mapping):
        raise ValueError(f"{owner} state has fingerprint={theirs!r}: expected a dict (what state_dict() returned)")
    for key, value in mine.items():
        if theirs.get(key) != value:
            raise ValueError(f"{owner} state has {key}={theirs.get(key)!r} but this {owner} has {key}={value!r}; "
                             "resume with the configuration and data the state was taken with")


def state_mapping(owner: str, state: object) -> Mapping[str, Any]:
    """``state`` itself, once it is a mapping (a state read from a damaged checkpoint may be anything).

    Raises:
        ValueError: it is not a mapping.
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"a {owner} state must be a dict (what its state_dict() returned), got {type(state).__name__}")
    return state


def state_int(owner: str, state: Mapping[str, Any], key: str, *, low: int = 0, high: int | None = None,
              why: str = "", name: str | None = None) -> int:
    """The integer ``state[key]``, checked to lie in ``low..high`` (``high=None``: no upper bound).

    ``name`` is how messages call the field (``key`` by default); ``why`` follows the range in them.

    Raises:
        ValueError: the field is missing, not an integer (a bool is not one), or out of range: naming it and its value.
    """
    name = key if name is None else name
    if key not in state:
        raise ValueError(f"{owner} state has no {name!r} field (it was cut short, or is not a {owner} state)")
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner} state has {name}={value!r}: expected an int")
    number = int(value)
    if number < low or (high is not None and number > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{owner} state has {name}={value!r}: expected an int {bound}{why}")
    return number
