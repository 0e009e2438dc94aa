"""How much later a step ended than the schedule with its known compute: communication and host runtime, never negative.

The books (:mod:`.books`) split a rank's lost time into parts; two of them, communication and host runtime, are what
the measured step adds to the schedule run with the known compute alone (the *known* step). They are read along the
measured step's critical path, walked back from its last action (on whichever rank): each action on it was gated by
the later-ending of its rank's previous action and the action on another rank whose output it reads. Going forward
along that path, the measured time runs ahead of the known one by

- each action's time beyond its known compute (**host runtime**), and the path's start after the step's first span;
- each gap's growth over the same gap in the known schedule: **communication** after a message-maker on another rank
  (posting, the link, the receive), **host runtime** after the rank's own action;
- the pipeline step's own set-up and finish, the step less the spans' extent (**host runtime**).

Their sum is exactly how much later the step ended than the known step: each edge's known gap is idle the known
schedule has anyway (warm-up/cool-down or imbalance). A growth can be negative, and each part could go negative with
it: a gap the known schedule had as *slack* (the action waited there for its other input) shrinks when the lateness
that reached it along the path was already booked. ``zbv`` under ``sim:400`` printed "communication -3.2%" that way:
rank 1's host runtime made its input gradient arrive 3.7 ms late, inside 3.7 ms of rank 0's slack, so the message's
gap "shrank" by what had been booked as rank 1's runtime behind it.

Slack absorbs lateness, it creates no negative cost: a negative growth takes back what the path had booked so far,
from each part in proportion to its size (the delay that reached the slack is made of them alike), and only a path
that is ahead of the known schedule (actions faster than their known compute, on a real device whose known compute is
a mean) holds an ``ahead`` remainder, which a later lateness repays first. So ``communication + runtime - ahead``
is the step's delay, and at most one of the two sides is non-zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .orders import Op
from .simulate import Span

__all__ = ["Lateness", "lateness"]

_PARTS = ("communication", "runtime")


class Lateness:
    """The running delay of a path over the known schedule, in parts (see the module docstring)."""

    def __init__(self) -> None:
        self.parts = dict.fromkeys(_PARTS, 0.0)
        self.ahead = 0.0

    def add(self, part: str, seconds: float) -> None:
        """A growth of ``seconds`` caused by ``part``; a negative one is slack that absorbs what was booked."""
        if seconds >= 0:
            repaid = min(seconds, self.ahead)
            self.ahead -= repaid
            self.parts[part] += seconds - repaid
        else:
            self.absorb(-seconds)

    def absorb(self, seconds: float) -> None:
        """Take ``seconds`` back from the parts, in proportion to each; what they do not hold puts the path ahead."""
        held = sum(self.parts.values())
        taken = min(seconds, held)
        if taken > 0:
            keep = 1 - taken / held
            for part in self.parts:
                self.parts[part] *= keep
        self.ahead += seconds - taken

    def to_dict(self) -> dict[str, float]:
        """``communication``, ``runtime`` and ``ahead``, seconds."""
        return {**self.parts, "ahead": self.ahead}


def _producer(op: Op, last: int) -> tuple[str, int, int] | None:
    """The (kinds, stage, micro-batch) of the action whose output ``op`` reads from the next or previous stage."""
    if op.kind == "F" and op.stage > 0:
        return "F", op.stage - 1, op.mb
    if op.kind in ("B", "I") and op.stage < last:
        return "BI", op.stage + 1, op.mb
    return None


def lateness(spans: Sequence[Span], owner: Sequence[int], known: Mapping[Op, Span], step_s: float) -> dict[str, float]:
    """How much later one step ended than the known schedule: ``communication``, ``runtime`` and ``ahead`` (seconds).

    ``spans``: the step's compute actions, every rank's, times from the step's first span; ``known``: every action as
    the schedule runs it with the known compute alone; ``step_s``: the pipeline's step as the trainer timed it (the
    spans' extent plus its set-up and finish). ``communication + runtime - ahead`` is ``step_s`` less the known step's
    end (its last action's, optimizer steps aside, on any rank), exactly, whichever action ended the measured step;
    none is negative.
    """
    last = len(owner) - 1
    by_op = {(s.op.kind, s.op.stage, s.op.mb): s for s in spans}
    previous: dict[Span, Span] = {}
    for r in {s.rank for s in spans}:
        row = sorted((s for s in spans if s.rank == r), key=lambda s: s.start)
        previous.update(zip(row[1:], row[:-1], strict=True))
    origin = min(s.start for s in spans)
    cur = max(spans, key=lambda s: s.end)  # the step's last action, on whichever rank
    extent = cur.end - origin
    # The known step ends at its own last action, which a loaded host can make another than the measured one's: the
    # known schedule's time after the measured last action's known end is slack there (booked below).
    tail = known[cur.op].end - max(s.end for op, s in known.items() if op.kind != "O")
    growths: list[tuple[str, float]] = []  # from the step's last action back to the path's first
    while True:
        mine = known[cur.op]
        growths.append(("runtime", (cur.end - cur.start) - (mine.end - mine.start)))
        local = previous.get(cur)
        reads = _producer(cur.op, last)
        remote = None
        if reads is not None and owner[reads[1]] != cur.rank:
            remote = next((by_op[(k, reads[1], reads[2])] for k in reads[0] if (k, reads[1], reads[2]) in by_op), None)
        gate = max((g for g in (local, remote) if g is not None), key=lambda g: g.end, default=None)
        if gate is None:  # the path's first action (0 and 0 in both, or the path starts late)
            growths.append(("runtime", (cur.start - origin) - mine.start))
            break
        growths.append(("communication" if gate is remote else "runtime",
                        (cur.start - gate.end) - (mine.start - known[gate.op].end)))
        cur = gate
    late = Lateness()
    for part, seconds in reversed(growths):  # forward in time: slack absorbs only what reached it
        late.add(part, seconds)
    late.add("runtime", tail)
    late.add("runtime", step_s - extent)  # the pipeline step's set-up and finish beside the path
    return late.to_dict()
