"""The position of the trainer's own feeds (generated tensors, generated tokens, torch's DataLoader): epoch, batches.

Their ``state_dict`` is ``{"epoch", "batches", "fingerprint"}``: the batches delivered in the epoch, checked on load
against the feed's fingerprint and length (the resume contract, :mod:`stallfree.core.resume`).
"""

from __future__ import annotations

from typing import Any

from stallfree.core.resume import check_fingerprint, state_int, state_mapping

__all__ = ["checked_position", "next_epoch"]


def checked_position(owner: str, state: object, fingerprint: dict[str, Any], batches: int) -> tuple[int, int]:
    """A feed state's ``(epoch, batches)``, once its fingerprint is this feed's and each field is in range."""
    state = state_mapping(owner, state)
    check_fingerprint(owner, state.get("fingerprint"), fingerprint)
    return state_int(owner, state, "epoch"), state_int(owner, state, "batches", high=batches,
                                                        why=" (the batches of an epoch)")


def next_epoch(epoch: int, position: int, loaded: bool, new: int) -> tuple[int, int]:
    """``(epoch, position)`` after ``set_epoch(new)``: a loaded position survives setting its own epoch."""
    if new < 0:
        raise ValueError(f"epoch must be >= 0, got {new}")
    return int(new), position if loaded and new == epoch else 0
