"""Elastic resume: a Loader state taken on ``W`` ranks, continued on ``W' != W`` ranks.

In synchronous training every rank has delivered the same number of batches when a state is taken, so every rank
stands at the same position ``P`` of its stream. Rank ``r`` of ``W`` reads global positions ``start + r + k*W``
(:mod:`.sampler`), so together the ranks have read exactly the global positions ``[start, start + P*W)``: a
prefix. The rest of the epoch is the split from ``start + P*W`` on, which the sampler deals over ``W'`` ranks as
it deals a fresh epoch; each remaining sample is then delivered exactly once (plus padding, as ever).

Two states cannot be continued elsewhere: one with skipped samples (each rank then stands at its own position,
and the skipped list is per rank) and one taken between the repeats of a batch echoed in ``echo_mode="batch"``
(the repeats left belong to that rank's batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ORDER_FIELDS", "elastic_split"]

#: Fingerprint fields that say how the order is dealt over ranks, not what it is: they may differ on resume (the rank
#: is in no fingerprint: any rank loads any rank's state).
ORDER_FIELDS = ("world_size",)


def elastic_split(state: Mapping[str, Any], world_size: int) -> int:
    """The global position where ``state``'s epoch goes on when it is dealt over ``world_size`` ranks.

    Raises:
        ValueError: the state has skipped samples, or stands between the repeats of an echoed batch.
    """
    theirs = int(state["fingerprint"]["world_size"])
    passed = [s for s in state["skipped"] if not s.get("document")]  # a skipped document's pack was delivered
    if passed:
        raise ValueError(
            f"this Loader state (world_size={theirs}) lists {len(passed)} skipped sample(s), so its ranks "
            f"stand at different positions and it cannot be continued on world_size={world_size}; resume on "
            f"{theirs} ranks, or start the next epoch (set_epoch) on {world_size}"
        )
    cursor, split = state["batcher"], state["sampler"]["split"]
    if cursor["repeat"]:
        raise ValueError(
            f"this Loader state (world_size={theirs}) was taken after repeat {cursor['repeat']} of an echoed batch "
            f"(echo_mode='batch'), not at a batch boundary; resume on {theirs} ranks, or take the state after the "
            "batch's last repeat"
        )
    return int(split) + int(cursor["position"]) * theirs
