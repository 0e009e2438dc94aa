"""Where a pipeline step's time went, per action kind and per message, from spans measured or simulated.

A span is one compute action of one rank. The trainer's timed stage records each forward, backward, input- and
weight-gradient chunk as a busy span of ``stage{index}`` in ``spans-{rank}.json`` (the stage clock's records,
numbered by step); the simulator's :class:`~.simulate.Span` carries its operation. The trainer's spans do not say
which operation they are, but each rank runs its operations in the order torch's schedule gives them
(:func:`~.orders.torch_order`), so the i-th span of a rank's step is the i-th operation of its program (the stage
of each is checked). Clocks are ``time.perf_counter``, one monotonic clock for every process of a machine.

From the spans of one or more steps (:func:`attribute`):

- **per action kind** (F, B, I, W): the mean busy seconds of one action;
- **the send gap**: after an action that sends to another rank, until that rank's next action, counted only
  where the next action reads no message from another rank: the sender's own cost of posting the send;
- **per message** (``act 0->1``: activations from rank 0 to rank 1; ``grad 1->0``: gradients back): the delay from
  the end of the action that made the message to the start of the action that reads it, counted only where the
  receiver was free (its previous action, and that action's send, done) before the message was made. The delay is
  then the sender's posting, the link and the receiver's completion, and no queueing behind other work.

:func:`fit_overhead` turns measured runs' spans and their stages' compute into a :class:`~.costs.HostOverhead`
(each kind's busy time beyond its compute, the send gap, the receiver's completion of a message that has arrived)
and the link's latency (the message delay beyond those).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .costs import HostOverhead, Link, StageCost
from .orders import Op
from .simulate import Span, compute_s

__all__ = ["Attribution", "Measured", "attribute", "fit_overhead", "steps_from_records", "trainer_steps"]

_STAGE = re.compile(r"stage(\d+)")


@dataclass(frozen=True)
class Attribution:
    """Means over the steps' spans (see the module docstring); ``samples`` counts what each mean is over."""

    per_action_s: dict[str, float]
    per_message_s: dict[str, float]
    send_s: float | None  # None: no action sent with a next action free of messages
    samples: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {"per_action_s": self.per_action_s, "per_message_s": self.per_message_s, "send_s": self.send_s,
                "samples": self.samples}


def _producer(op: Op, last: int) -> tuple[str, int] | None:
    """The (message, stage) whose output ``op`` reads from another stage; None if it reads none."""
    if op.kind == "F" and op.stage > 0:
        return "act", op.stage - 1
    if op.kind in ("B", "I") and op.stage < last:
        return "grad", op.stage + 1
    return None


def _sends(op: Op, last: int) -> int | None:
    """The stage ``op``'s output goes to, or None."""
    if op.kind == "F" and op.stage < last:
        return op.stage + 1
    if op.kind in ("B", "I") and op.stage > 0:
        return op.stage - 1
    return None


def _send_gaps(steps: Sequence[Sequence[Span]],
               owner: Sequence[int]) -> tuple[list[float], set[Span], list[float]]:
    """The send gaps, the spans whose output went to another rank, and the local gaps.

    A local gap follows an action that sent nothing to another rank and precedes one that reads nothing from
    another: the runtime's own time between two actions.
    """
    last = len(owner) - 1
    gaps: list[float] = []
    local: list[float] = []
    sent: set[Span] = set()
    for spans in steps:
        by_rank: dict[int, list[Span]] = {}
        for s in spans:
            if s.op.kind != "O":
                by_rank.setdefault(s.rank, []).append(s)
        for row in by_rank.values():
            row.sort(key=lambda s: s.start)
            for i, a in enumerate(row):
                dst = _sends(a.op, last)
                remote = dst is not None and owner[dst] != a.rank
                if remote:
                    sent.add(a)
                b = row[i + 1] if i + 1 < len(row) else None
                reads = None if b is None else _producer(b.op, last)
                if b is not None and (reads is None or owner[reads[1]] == b.rank):
                    (gaps if remote else local).append(b.start - a.end)
    return gaps, sent, local


def _messages(steps: Sequence[Sequence[Span]], owner: Sequence[int], send_s: float,
              sent: set[Span]) -> list[tuple[str, Span, Span, float]]:
    """Each message between ranks: (name, the span that made it, the span that read it, when the reader was free).

    The name is ``act 0->1`` or ``grad 1->0``; the reader was free when its previous action, and that action's
    send, were done.
    """
    last = len(owner) - 1
    out = []
    for spans in steps:
        done = {(s.op.kind, s.op.stage, s.op.mb): s for s in spans if s.op.kind != "O"}
        previous: dict[Span, Span] = {}
        latest: dict[int, Span] = {}
        for s in sorted(done.values(), key=lambda s: s.start):
            if s.rank in latest:
                previous[s] = latest[s.rank]
            latest[s.rank] = s
        for s in done.values():
            reads = _producer(s.op, last)
            if reads is None or owner[reads[1]] == s.rank:
                continue
            kinds = ("F",) if reads[0] == "act" else ("B", "I")
            made = next((done[(k, reads[1], s.op.mb)] for k in kinds if (k, reads[1], s.op.mb) in done), None)
            if made is None:
                continue
            before = previous.get(s)
            free = 0.0 if before is None else before.end + (send_s if before in sent else 0.0)
            out.append((f"{reads[0]} {made.rank}->{s.rank}", made, s, free))
    return out


def attribute(steps: Sequence[Sequence[Span]], owner: Sequence[int]) -> Attribution:
    """Per action kind, send gap and per message (see the module docstring) over ``steps``' spans.

    ``owner`` is the rank of each model stage.
    """
    per_kind: dict[str, list[float]] = {}
    for spans in steps:
        for s in spans:
            if s.op.kind != "O":
                per_kind.setdefault(s.op.kind, []).append(s.end - s.start)
    gaps, sent, _ = _send_gaps(steps, owner)
    send_s = statistics.fmean(gaps) if gaps else None
    delays: dict[str, list[float]] = {}
    for key, made, read, free in _messages(steps, owner, send_s or 0.0, sent):
        if free <= made.end:  # the reader waited for it
            delays.setdefault(key, []).append(read.start - made.end)
    samples = {k: len(v) for k, v in per_kind.items()} | {k: len(v) for k, v in delays.items()} | {"send": len(gaps)}
    return Attribution({k: statistics.fmean(v) for k, v in sorted(per_kind.items())},
                       {k: statistics.fmean(v) for k, v in sorted(delays.items())}, send_s, samples)


@dataclass(frozen=True)
class Measured:
    """One measured run's spans (:func:`trainer_steps`) with what it ran: stage owners and compute per stage."""

    steps: Sequence[Sequence[Span]]
    owner: Sequence[int]
    costs: Sequence[StageCost]


def _median(values: Sequence[float], default: float = 0.0) -> float:
    return max(0.0, statistics.median(values)) if values else default


def fit_overhead(runs: Sequence[Measured], link: Link, step_s: float = 0.0) -> tuple[HostOverhead, float]:
    """The runtime overhead the measured ``runs`` show beyond their stages' compute, and the link's latency.

    Per kind (``kind_s``): the median busy time of its actions less their stage's compute for that kind;
    ``action_s``: the same over every action (for kinds not seen). The idle costs, medians too: ``gap_s``, the gap
    between two actions of a rank where the first sends nothing to another rank and the second reads nothing
    from one; ``send_s``, the gap after an action that sends, less ``gap_s``; ``message_s`` (the receiver's
    completion of a message that is there), the gap before an action whose message arrived long before its rank
    was free (made more than twice the median delay earlier); the latency, the delay of the messages a rank
    waited for (free a ``message_s`` before the message was made) less the gap and their bytes on ``link``'s
    bandwidth: such a message leaves as its sender posts it, after the gap, and the receive completes as it
    arrives (:mod:`.simulate`'s rule; ``link``'s own latency is not used: a ping-pong's is not what a
    pipeline's messages see). ``step_s`` is given: the spans do not show
    the step's own set-up. Medians because a few steps on a loaded machine catch a few gaps and actions of
    a whole time slice (2-20 ms) that would dominate their mean: in one sweep a burst of load during mlp's
    1F1B pilots made the mean forward 1.6 ms beyond its compute, where the cells' steps then paid 0.2-0.3.

    Raises:
        ValueError: no compute action in the spans.
    """
    residual: dict[str, list[float]] = {}
    gaps: list[float] = []
    local: list[float] = []
    sent: list[set[Span]] = []
    for run in runs:
        for spans in run.steps:
            for s in spans:
                if s.op.kind != "O":
                    residual.setdefault(s.op.kind, []).append(s.end - s.start - compute_s(s.op, run.costs[s.op.stage]))
        more, out, idle = _send_gaps(run.steps, run.owner)
        gaps += more
        local += idle
        sent.append(out)
    if not residual:
        raise ValueError("fitting the host overhead needs spans of compute actions, got none")
    gap_s = _median(local)
    send_s = max(0.0, _median(gaps, gap_s) - gap_s)
    messages = [(run, made, read, free + gap_s) for run, out in zip(runs, sent, strict=True)
                for _, made, read, free in _messages(run.steps, run.owner, send_s, out)]
    waited = [(run, made, read, free) for run, made, read, free in messages if free <= made.end]
    typical = _median([read.start - made.end for _, made, read, _ in waited])
    receive_s = _median([read.start - free for _, made, read, free in messages if free - made.end > 2 * typical])
    # A receive posted before its message arrives completes as it arrives (the simulator's rule), so the delay
    # of a message whose reader had posted its receive a receive's time before it was made is the sender's gap,
    # the link and its bytes: the send's own cost follows the posting, the receive's hides in the wait.
    early = [w for w in waited if w[3] + receive_s <= w[1].end] or waited
    latency_s = _median([read.start - made.end - gap_s
                         - link.busy_s(run.costs[min(made.op.stage, read.op.stage)].output_bytes)
                         for run, made, read, _ in early], link.latency_s)
    every = [v for values in residual.values() for v in values]
    overhead = HostOverhead(_median(every), receive_s, max(0.0, step_s), send_s,
                            tuple((k, _median(v)) for k, v in sorted(residual.items())), gap_s)
    return overhead, latency_s


def trainer_steps(out_dir: str | Path, program: Mapping[int, Sequence[Op]], skip: int = 1) -> list[list[Span]]:
    """The trainer's measured spans under ``out_dir`` (``spans-{rank}.json``), one list per step after ``skip``.

    Raises:
        FileNotFoundError: a rank's spans file is missing.
        ValueError: as :func:`steps_from_records`.
    """
    records = {}
    for rank in program:
        path = Path(out_dir) / f"spans-{rank}.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no spans of rank {rank} (stallfree train writes one per rank)")
        records[rank] = (str(path), json.loads(path.read_text()))
    return steps_from_records(records, program, skip)


def steps_from_records(records: Mapping[int, tuple[str, dict[str, Any]]], program: Mapping[int, Sequence[Op]],
                       skip: int = 1) -> list[list[Span]]:
    """Each step's spans (after the first ``skip``) from the stage clock's records of every rank.

    ``records``: rank -> (where they came from, for errors; ``StageClock.to_records()``). ``program`` is what each
    rank ran (:func:`~.orders.torch_order`): the i-th busy ``stage{index}`` span of a rank's step becomes its i-th
    operation. Times are made relative to each step's earliest span.

    Raises:
        ValueError: a rank's step has another count of spans than its program, or a span's stage is not its
            operation's; the message names the source and the step.
    """
    per_step: dict[int, list[Span]] = {}
    for rank, ops in program.items():
        where, data = records[rank]
        rows: dict[int, list[tuple[float, float, int]]] = {}
        for stage, state, start, end, step, *_ in data["spans"]:
            match = _STAGE.fullmatch(str(stage))
            if match and state == "busy" and step is not None:
                rows.setdefault(int(step), []).append((float(start), float(end), int(match.group(1))))
        for step, row in sorted(rows.items())[skip:]:
            row.sort()
            if len(row) != len(ops):
                raise ValueError(f"{where}, step {step}: {len(row)} busy spans, but rank {rank}'s schedule runs "
                                 f"{len(ops)} actions")
            for (start, end, stage), op in zip(row, ops, strict=True):
                if stage != op.stage:
                    raise ValueError(f"{where}, step {step}: a span of stage {stage} where the schedule runs {op}")
                per_step.setdefault(step, []).append(Span(rank, op, start, end))
    out = []
    for _, spans in sorted(per_step.items()):
        origin = min(s.start for s in spans)
        out.append([Span(s.rank, s.op, s.start - origin, s.end - origin) for s in spans])
    return out
