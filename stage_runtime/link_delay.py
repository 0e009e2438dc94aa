"""A slow link between two pipeline ranks, run for real: ``--link-delay RANKS:MS``.

``0-1:20`` gives the link between pipeline ranks 0 and 1 a latency of 20 ms: every message the schedule sends
between them (activations forward, gradients back, in both directions) arrives 20 ms after it was sent, while its
sender goes on computing. That is what a cross-site (WAN) link's latency does, and what the plan simulator's
:class:`~stallfree.stage_runtime.plan.costs.Link` latency models, so ``stallfree plan --cross-link BW,20ms`` with
the sites cut at that pair predicts the run, and so does ``stallfree train``'s own prediction (docs/plan.md, "A
slow link, run for real").

How it is run (``stage.TimedStage``), on the receiving side. The sender appends its clock reading
(``time.perf_counter()``, taken when torch's schedule asks for the chunk's send ops, right after its compute) to the
chunk's messages, as one more tensor in the same batch of sends; the receiver appends the matching receive to the
chunk's receive ops. Torch's schedules wait for a chunk's whole batch of receives before they run the chunk, and
the stage then waits, holding no core, until the sender's reading plus the delay before computing (a ``waiting``
span ``link{stage}`` in the trace). Nothing is posted late and no send is held back: the sender's sends complete as
they would on a fast link, its next chunk starts right after its last, and gloo's in-order matching per pair keeps
every message where it was. Both readings come from one clock: ``perf_counter`` is ``CLOCK_MONOTONIC``, shared by
every process of a machine (the trainer's spans rely on it too), so a job across machines is refused
(:meth:`LinkDelay.check_one_machine`). A message read later than the delay (its receiver was busy) waits no more.

The delay applies to the schedule's messages, what the simulator models; the labels stage 0 sends the last stage
once per step and the evaluation's forward are not delayed.

The string is parsed once, where it enters (``TrainConfig``); this module imports no torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LinkDelay", "parse_link_delay"]

_PAIR = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*:\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*")
_HINT = "--link-delay wants RANK-RANK:MS pairs like 0-1:20 (comma-separated or repeated)"


@dataclass(frozen=True)
class LinkDelay:
    """The latency in seconds of each delayed link between two pipeline ranks: ``((low rank, high rank, s), ...)``."""

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

    def check_one_machine(self, local_processes: int, processes: int) -> None:
        """Refuse a job whose ``processes`` are not all on this machine (``local_processes`` of them are).

        Raises:
            ValueError: the delay compares clock readings of two processes, which only one machine's clock allows.
        """
        if local_processes != processes:
            raise ValueError(f"--link-delay {self}: the job runs {processes} processes, {local_processes} on this "
                             "machine; a delayed message is timed by one clock every process of a machine shares, "
                             "so run a job with --link-delay on one machine (--nnodes 1)")

    def __str__(self) -> str:
        return ",".join(f"{a}-{b}:{s * 1e3:g}" for a, b, s in self.pairs)


def parse_link_delay(value: str | Sequence[str] | LinkDelay | None) -> LinkDelay | None:
    """``"0-1:20"``, ``"0-1:20,2-3:50"`` or a list of those (the repeated flag) as a :class:`LinkDelay`.

    The one parser of ``--link-delay``; ``None`` or an empty list: no delay; a :class:`LinkDelay` is returned as it is.

    Raises:
        ValueError: bad syntax, a rank paired with itself, a negative or infinite delay or a pair given twice,
            naming the argument and the accepted form.
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
        if not (ms >= 0 and math.isfinite(ms)):  # 1e999 reads as inf
            raise ValueError(f"--link-delay {part.strip()}: the delay must be a finite number of ms >= 0, got {ms:g}")
        key = (min(a, b), max(a, b))
        if key in found:
            raise ValueError(f"--link-delay gives ranks {key[0]}-{key[1]} twice; give each pair one delay")
        found[key] = ms / 1e3
    return LinkDelay(tuple((a, b, s) for (a, b), s in sorted(found.items()))) if found else None
