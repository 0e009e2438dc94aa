"""An event simulation of one pipeline step: step time, idle time, bubble causes and activation memory.

Each rank runs its operations in order, each as soon as its inputs have arrived.

Dependencies (``N`` model stages, stage ``s`` on rank ``owner[s]``)::

    F(s, m)  needs F(s-1, m)'s output, sent over the link owner[s-1] -> owner[s]
    B(s, m)  needs F(s, m) and B(s+1, m)'s input gradient, sent back over owner[s+1] -> owner[s]
    I(s, m)  as B; W(s, m) needs I(s, m);  O (optimizer) needs nothing but its rank's earlier operations

A send occupies its directed link for bytes / bandwidth (messages on one link queue first-come first-served),
arrives a latency later, and costs the sender nothing (torch's sends are asynchronous). A rank busy computing is
busy; a rank waiting is idle, and the idle share of ranks x schedule time is the bubble, measured as the trainer
measures it. The bubble is split into causes by simulating the same order twice more: with every stage's cost
the mean of the stages' and free links (what is left is the schedule's own warm-up and cool-down), then with the
real costs and free links (what that adds is imbalance); the rest is communication.

The host's own cost of torch's runtime (:class:`~.costs.HostOverhead`, calibrated on this machine) is charged too:
``action_s`` (or its kind's ``kind_s``) on every compute action (busy, as the trainer's stage timing counts it),
``send_s`` on the sending rank after an action that sends to another rank and ``message_s`` on the receiving rank
before the action that reads it (idle), ``gap_s`` after every compute action (idle, before its send), and
``step_s`` on every rank before the first action (idle). With all of them 0 the textbook holds.

Ranks that share cores (:class:`~.costs.Cores`: stage processes on one CPU machine) compute slower while more of
them compute at once than the cores hold, so the simulation advances from event to event (an action starts, its
compute ends, it ends) and settles every computing action's remaining work whenever their speed changes::

    4 ranks, 1 thread each, 2 cores:   computing  1    2    3    4
                                       speed      1    1   2/3  1/2

An action's host overhead runs after its compute, unshared. Without shared cores no speed ever changes, and an
action ends at exactly its start plus its cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .costs import FREE_LINK, NO_OVERHEAD, Cores, HostOverhead, Link, StageCost
from .orders import Op

__all__ = ["Bubble", "Span", "StepResult", "compute_s", "simulate", "simulate_step"]

LinkFor = Callable[[int, int], Link]


@dataclass(frozen=True)
class Span:
    """One operation as it ran: ``rank`` computed ``op`` from ``start`` to ``end`` (seconds from step start)."""

    rank: int
    op: Op
    start: float
    end: float


@dataclass(frozen=True)
class Bubble:
    """The idle share of ranks x schedule time, and its causes (they sum to ``total``).

    ``communication`` holds the links and the runtime's per-message host time; ``runtime`` the schedule step's own
    set-up (:attr:`~.costs.HostOverhead.step_s`).
    """

    total: float
    warmup_cooldown: float
    imbalance: float
    communication: float
    runtime: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """As JSON."""
        return {"total": self.total, "warmup_cooldown": self.warmup_cooldown, "imbalance": self.imbalance,
                "communication": self.communication, "runtime": self.runtime}


@dataclass(frozen=True)
class StepResult:
    """One simulated step."""

    step_s: float  # schedule, then each rank's optimizer step: when the last rank is done
    schedule_s: float  # the schedule alone (the trainer's bubble is measured over this)
    busy_s: tuple[float, ...]  # per rank, compute inside the schedule
    idle_s: tuple[float, ...]  # per rank, schedule_s - busy
    peak_activation_bytes: tuple[int, ...]  # per rank
    peak_stage_activation_bytes: tuple[int, ...]  # per model stage
    spans: tuple[Span, ...]
    transfers: int  # messages between ranks
    optimizer_s: tuple[float, ...] = ()  # per rank, the optimizer step after the schedule (0 if in the program)
    bubble: Bubble | None = field(default=None)

    @property
    def bubble_share(self) -> float:
        """1 - sum(busy) / (ranks x schedule time)."""
        ranks = len(self.busy_s)
        return 1.0 - sum(self.busy_s) / (ranks * self.schedule_s) if self.schedule_s > 0 else 0.0


def compute_s(op: Op, cost: StageCost) -> float:
    """The seconds of compute ``op`` (F, B, I or W) takes on a stage of ``cost``."""
    if op.kind == "F":
        return cost.forward_s
    if op.kind == "B":
        return cost.backward_s
    if op.kind == "I":
        return cost.input_s
    return cost.weight_s


@dataclass
class _Running:
    """An operation under way on its rank.

    ``left`` seconds of compute at full speed remain since ``since``; then ``after`` seconds of the runtime's host
    work, not shared (the calibration measured it with the ranks already sharing the cores).
    """

    op: Op
    start: float
    left: float
    since: float
    after: float
    end: float | None = None  # known once its compute is done


def simulate(program: Mapping[int, Sequence[Op]], owner: Sequence[int], costs: Sequence[StageCost],
             link: LinkFor, optimizer_s: Sequence[float] | None = None,
             overhead: HostOverhead = NO_OVERHEAD, cores: Cores | None = None) -> StepResult:
    """Run ``program`` (each rank's operations in order) and return what happened.

    Args:
        program: rank -> its operations; ranks are 0..R-1.
        owner: the rank of each model stage.
        costs: each model stage's cost per micro-batch.
        link: the link from one rank to another.
        optimizer_s: the optimizer step per rank after the schedule (default: the sum of its stages' shares);
            O operations inside the program cost the same.
        overhead: the host's cost of torch's runtime per action, message and step (none by default).
        cores: the cores the ranks share, stretching their compute while more of them compute at once than the
            cores hold (:class:`~.costs.Cores`); ``None`` (the default): each rank has a device of its own.

    Raises:
        ValueError: the program cannot finish (an operation waits for one that never runs), naming them.
    """
    ranks = len(program)
    last = len(costs) - 1
    if optimizer_s is None:
        opt = [0.0] * ranks
        for s, r in enumerate(owner):
            opt[r] += costs[s].optimizer_s
    else:
        opt = list(optimizer_s)
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, mb) -> end
    ready: dict[tuple[str, int, int], float] = {}  # ("act"|"grad", receiving stage, mb) -> arrival
    remote: set[tuple[str, int, int]] = set()  # the messages of ``ready`` that came from another rank
    link_free: dict[tuple[int, int], float] = {}
    now = [overhead.step_s] * ranks  # the step's own set-up, before any action
    nxt = [0] * ranks
    running: dict[int, _Running] = {}  # rank -> its operation under way
    rate = 1.0  # the speed of every computing rank, as a share of its own
    spans: list[Span] = []
    memory: list[tuple[float, int, int, int]] = []  # (time, +bytes/-bytes, rank, stage)
    transfers = 0

    def inputs_at(op: Op) -> float | None:
        s, m = op.stage, op.mb
        if op.kind == "F":
            return 0.0 if s == 0 else ready.get(("act", s, m))
        if op.kind in ("B", "I"):
            forward = done.get(("F", s, m))
            if forward is None:
                return None
            if s == last:
                return forward
            grad = ready.get(("grad", s, m))
            return None if grad is None else max(forward, grad)
        if op.kind == "W":
            return done.get(("I", s, m))
        return 0.0

    def start_at(r: int, op: Op) -> float | None:
        """When rank ``r`` can start ``op``: free, inputs arrived, and a message from another rank received."""
        at = inputs_at(op)
        if at is None:
            return None
        message = ("act" if op.kind == "F" else "grad", op.stage, op.mb)
        receive = overhead.message_s if op.kind in "FBI" and message in remote else 0.0
        return max(at, now[r]) + receive

    def send(kind: str, src_stage: int, dst_stage: int, m: int, at: float, nbytes: int) -> float:
        """Send from ``src_stage`` at ``at``; returns when its sender is free again."""
        nonlocal transfers
        src, dst = owner[src_stage], owner[dst_stage]
        if src == dst:
            ready[(kind, dst_stage, m)] = at
            return at
        at += overhead.sender_s  # posting the send occupies the sender; the message leaves after it
        ln = link(src, dst)
        start = max(at, link_free.get((src, dst), 0.0))
        link_free[(src, dst)] = start + ln.busy_s(nbytes)
        ready[(kind, dst_stage, m)] = start + ln.busy_s(nbytes) + ln.latency_s
        remote.add((kind, dst_stage, m))
        transfers += 1
        return at

    def reshare(t: float, computing: int) -> None:
        """At ``t``, ``computing`` ranks compute from now on: settle the compute done so far if the speed changes.

        Only a change of speed touches the figures, so without sharing an operation ends at exactly its start
        plus its cost.
        """
        nonlocal rate
        new = cores.rate(computing) if cores is not None else 1.0
        if new != rate:
            for run in running.values():
                if run.end is None:
                    run.left -= (t - run.since) * rate
                    run.since = t
            rate = new

    def finish(r: int, run: _Running) -> None:
        """``run`` ended: its span, its outputs sent, its memory, and when its rank is free again."""
        op, end = run.op, run.end
        assert end is not None  # finished only once its compute is done
        spans.append(Span(r, op, run.start, end))
        if op.kind == "O":
            now[r] = end
            return
        now[r] = end + overhead.gap_s
        cost = costs[op.stage]
        done[(op.kind, op.stage, op.mb)] = end
        if op.kind == "F":
            memory.append((run.start, cost.activation_bytes, r, op.stage))
            if op.stage < last:
                now[r] = send("act", op.stage, op.stage + 1, op.mb, now[r], cost.output_bytes)
        elif op.kind in ("B", "I"):
            if op.kind == "B":
                memory.append((end, -cost.activation_bytes, r, op.stage))
            if op.stage > 0:
                now[r] = send("grad", op.stage, op.stage - 1, op.mb, now[r], costs[op.stage - 1].output_bytes)
        elif op.kind == "W":  # the weight gradient still reads the stage's saved inputs: freed only now
            memory.append((end, -cost.activation_bytes, r, op.stage))

    total_ops = sum(len(p) for p in program.values())
    t = 0.0
    while len(spans) < total_ops:
        # The next event, in time order; at a tie, an end before a compute's end before a start, then by rank.
        best: tuple[float, int, int] | None = None
        for r in range(ranks):
            run = running.get(r)
            if run is not None:
                event = (run.end, 0, r) if run.end is not None else (max(t, run.since + run.left / rate), 1, r)
            elif nxt[r] < len(program[r]):
                at = start_at(r, program[r][nxt[r]])
                if at is None:
                    continue
                event = (at, 2, r)
            else:
                continue
            if best is None or event < best:
                best = event
        if best is None:
            stuck = [str(program[r][nxt[r]]) for r in range(ranks) if nxt[r] < len(program[r])]
            raise ValueError(f"the schedule cannot finish: each rank's next operation waits for one that never "
                             f"runs (rank by rank: {', '.join(stuck)})")
        t, what, r = best
        if what == 0:  # the action's host work is done too
            finish(r, running.pop(r))
        elif what == 1:  # its compute is done; the host work after it is not shared
            run = running[r]
            run.end = max(t, run.since + (run.left / rate + run.after))
            reshare(t, sum(x.end is None for x in running.values()))
        else:
            op = program[r][nxt[r]]
            nxt[r] += 1
            work = opt[r] if op.kind == "O" else compute_s(op, costs[op.stage])
            host = 0.0 if op.kind == "O" else overhead.action(op.kind)
            reshare(t, sum(x.end is None for x in running.values()) + 1)
            running[r] = _Running(op, t, work, t, host)
    spans.sort(key=lambda x: (x.start, x.rank))  # in the order they started, as the trainer's clock lists them

    compute = [s for s in spans if s.op.kind != "O"]
    schedule_s = max((s.end for s in compute), default=0.0)
    busy = [0.0] * ranks
    for span in compute:
        busy[span.rank] += span.end - span.start
    after = [0.0 if any(o.kind == "O" for o in program[r]) else opt[r] for r in range(ranks)]  # not twice
    step_s = max(max((x.end for x in spans if x.rank == r), default=0.0) + after[r] for r in range(ranks))
    peak_rank, peak_stage = [0] * ranks, [0] * len(costs)
    held_rank, held_stage = [0] * ranks, [0] * len(costs)
    for _, delta, r, s in sorted(memory, key=lambda e: (e[0], e[1])):  # frees before allocations at a tie
        held_rank[r] += delta
        held_stage[s] += delta
        peak_rank[r] = max(peak_rank[r], held_rank[r])
        peak_stage[s] = max(peak_stage[s], held_stage[s])
    return StepResult(step_s, schedule_s, tuple(busy), tuple(schedule_s - b for b in busy), tuple(peak_rank),
                      tuple(peak_stage), tuple(spans), transfers, tuple(after))


def _mean_costs(costs: Sequence[StageCost]) -> list[StageCost]:
    n = len(costs)
    mean = StageCost(sum(c.forward_s for c in costs) / n, sum(c.backward_s for c in costs) / n,
                     sum(c.weight_s for c in costs) / n, 0, 0, 0, sum(c.optimizer_s for c in costs) / n)
    return [replace(mean, activation_bytes=c.activation_bytes, output_bytes=c.output_bytes,
                    param_bytes=c.param_bytes) for c in costs]


def simulate_step(program: Mapping[int, Sequence[Op]], owner: Sequence[int], costs: Sequence[StageCost],
                  link: LinkFor, causes: bool = True, overhead: HostOverhead = NO_OVERHEAD,
                  cores: Cores | None = None) -> StepResult:
    """:func:`simulate`, with the bubble split into its causes (two more runs) when ``causes``.

    The two runs keep ``overhead``'s per-action cost (it is part of each action, as compute is) and drop its
    per-message cost (communication) and per-step set-up (``runtime``, ``step_s`` / schedule time). They share
    ``cores`` as the step does: ranks sharing cores compute slower, which shows in their busy time, not as a
    cause of idle time.
    """
    result = simulate(program, owner, costs, link, overhead=overhead, cores=cores)
    if not causes or result.schedule_s <= 0:
        return result
    ranks, t, busy = len(program), result.schedule_s, sum(result.busy_s)
    free: LinkFor = lambda a, b: FREE_LINK  # noqa: E731
    actions = overhead.actions_only()
    ideal = simulate(program, owner, _mean_costs(costs), free, overhead=actions, cores=cores).schedule_s
    no_comm = simulate(program, owner, costs, free, overhead=actions, cores=cores).schedule_s
    runtime = overhead.step_s / t
    bubble = Bubble(result.bubble_share, (ranks * ideal - busy) / (ranks * t), (no_comm - ideal) / t,
                    (t - no_comm) / t - runtime, runtime)
    return replace(result, bubble=bubble)
