"""A slow link between two pipeline ranks, run for real: ``--link-delay RANKS:MS``.

``0-1:20`` makes every message the schedule sends between pipeline ranks 0 and 1 (activations forward, gradients
back, in both directions) wait 20 ms on its sender before it is posted. What the wait models is a link whose
sender is held for each message: the sending rank sleeps (holding no core, as the simulated device does for
compute) right after the action that made the message, then posts the send; the message therefore arrives at
least the delay after the action ended, and the sender computes nothing in between. It is idle time in the
trainer's bubble, and ``stallfree train``'s prediction charges the same hold
(:attr:`stallfree.stage_runtime.plan.costs.Link.hold_s`). It is not a latency that overlaps the sender's compute
(``stallfree plan --cross-link``'s latency is): a held sender is the pessimistic end of a slow link (docs/plan.md,
"A slow link, run for real").

The delay applies to the schedule's messages, what the plan simulator models; the labels stage 0 sends the last
stage once per step and the evaluation's forward are not delayed.

The string is parsed once, where it enters (``TrainConfig``); this module imports no torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LinkDelay", "parse_link_delay"]

_PAIR = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*:\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*")
_HINT = "--link-delay wants RANK-RANK:MS pairs like 0-1:20 (comma-separated or repeated)"


@dataclass(frozen=True)
class LinkDelay:
    """Seconds each message between two pipeline ranks waits on its sender: ``((low rank, high rank, s), ...)``."""

    pairs: tuple[tuple[int, int, float], ...]

    def seconds(self, a: int, b: int) -> float:
        """The delay of a message between pipeline ranks ``a`` and ``b`` (either direction); 0 without one."""
        low, high = min(a, b), max(a, b)
        return next((s for x, y, s in self.pairs if (x, y) == (low, high)), 0.0)

    def check(self, ranks: int, talking: Sequence[tuple[int, int]], where: str) -> None:
        """Refuse a pair outside ``ranks`` pipeline ranks or one that exchanges no messages.

        ``talking`` lists the pairs of ranks the schedule sends between; ``where`` says which job (for the message).

        Raises:
            ValueError: naming the pair and the pairs that do exchange messages.
        """
        pairs = sorted({(min(a, b), max(a, b)) for a, b in talking})
        shown = ", ".join(f"{a}-{b}" for a, b in pairs) or "none"
        for a, b, _ in self.pairs:
            if b >= ranks:
                raise ValueError(f"--link-delay {a}-{b}: pipeline rank {b} is out of range; {where} has ranks "
                                 f"0..{ranks - 1}")
            if (a, b) not in pairs:
                raise ValueError(f"--link-delay {a}-{b}: pipeline ranks {a} and {b} exchange no messages in {where}; "
                                 f"the pairs that do: {shown}")

    def __str__(self) -> str:
        return ",".join(f"{a}-{b}:{s * 1e3:g}" for a, b, s in self.pairs)


def parse_link_delay(value: str | Sequence[str] | LinkDelay | None) -> LinkDelay | None:
    """``"0-1:20"``, ``"0-1:20,2-3:50"`` or a list of those (the repeated flag) as a :class:`LinkDelay`.

    The one parser of ``--link-delay``; ``None`` or an empty list: no delay; a :class:`LinkDelay` is returned as it is.

    Raises:
        ValueError: bad syntax, a rank paired with itself, a negative delay or a pair given twice, naming the
            argument and the accepted form.
    """
    if value is None or isinstance(value, LinkDelay):
        return value
    texts = [value] if isinstance(value, str) else list(value)
    found: dict[tuple[int, int], float] = {}
    for part in (p for text in texts for p in str(text).split(",")):
        match = _PAIR.fullmatch(part)
        if match is None:
            raise ValueError(f"{_HINT}, got {part.strip()!r}")
        a, b, ms = int(match.group(1)), int(match.group(2)), float(match.group(3))
        if a == b:
            raise ValueError(f"--link-delay {part.strip()}: a link joins two different pipeline ranks, got {a} twice")
        if ms < 0:
            raise ValueError(f"--link-delay {part.strip()}: the delay must be >= 0 ms, got {ms:g}")
        key = (min(a, b), max(a, b))
        if key in found:
            raise ValueError(f"--link-delay gives ranks {key[0]}-{key[1]} twice; give each pair one delay")
        found[key] = ms / 1e3
    return LinkDelay(tuple((a, b, s) for (a, b), s in sorted(found.items()))) if found else None
