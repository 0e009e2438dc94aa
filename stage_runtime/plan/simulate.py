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
``gap_s`` after every compute action (idle, before its send), ``wire_s`` on every message between ranks (its
delay beyond the link's latency), ``send_s`` on the sending rank after it posts a
send to another rank (idle; the message leaves as it is posted), ``message_s`` on the receiving rank for a
message that is already there when the rank is free to read it (idle: the receive is posted then and completes
``message_s`` later, or when the message arrives if that is later, the receive's cost then hidden in the wait:
gloo moves a message posted before its receive only once the receive is posted), and ``step_s`` on every rank
before the first action (idle). With all of them 0 the textbook holds.

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
    opt = _optimizer_per_rank(len(program), owner, costs) if optimizer_s is None else list(optimizer_s)
    events = _Events(program, owner, costs, link, opt, overhead, cores)
    events.run()
    return _result(events)


def _optimizer_per_rank(ranks: int, owner: Sequence[int], costs: Sequence[StageCost]) -> list[float]:
    """Each rank's optimizer step: the sum of its stages' shares."""
    opt = [0.0] * ranks
    for s, r in enumerate(owner):
        opt[r] += costs[s].optimizer_s
    return opt


class _Events:
    """One simulation's state, advanced from event to event until every rank has run its program.

    ``done`` holds when each (kind, stage, micro-batch) operation ended; ``ready`` when each ("act" | "grad",
    receiving stage, micro-batch) message arrived, ``remote`` those of them that came from another rank; ``now``
    when each rank is free; ``memory`` the (time, +bytes | -bytes, rank, stage) changes of activation memory.
    """

    def __init__(self, program: Mapping[int, Sequence[Op]], owner: Sequence[int], costs: Sequence[StageCost],
                 link: LinkFor, opt: Sequence[float], overhead: HostOverhead, cores: Cores | None) -> None:
        self.program, self.owner, self.costs, self.link = program, owner, costs, link
        self.opt, self.overhead, self.cores = opt, overhead, cores
        self.ranks, self.last = len(program), len(costs) - 1
        self.done: dict[tuple[str, int, int], float] = {}
        self.ready: dict[tuple[str, int, int], float] = {}
        self.remote: set[tuple[str, int, int]] = set()
        self.link_free: dict[tuple[int, int], float] = {}
        self.now = [overhead.step_s] * self.ranks  # the step's own set-up, before any action
        self.nxt = [0] * self.ranks
        self.running: dict[int, _Running] = {}  # rank -> its operation under way
        self.rate = 1.0  # the speed of every computing rank, as a share of its own
        self.spans: list[Span] = []
        self.memory: list[tuple[float, int, int, int]] = []
        self.transfers = 0

    def run(self) -> None:
        """Advance event by event until every operation has ended; the spans in the order they started."""
        total_ops = sum(len(p) for p in self.program.values())
        t = 0.0
        while len(self.spans) < total_ops:
            event = self.next_event(t)
            if event is None:
                stuck = [str(self.program[r][self.nxt[r]]) for r in range(self.ranks)
                         if self.nxt[r] < len(self.program[r])]
                raise ValueError(f"the schedule cannot finish: each rank's next operation waits for one that never "
                                 f"runs (rank by rank: {', '.join(stuck)})")
            t = event[0]
            self.apply(event)
        # In the order they started, as the trainer's clock lists them.
        self.spans.sort(key=lambda x: (x.start, x.rank))

    def next_event(self, t: float) -> tuple[float, int, int] | None:
        """The next event after ``t`` as (time, what, rank); ``None``: no rank can go on.

        At a tie, an end comes before a compute's end before a start, then by rank.
        """
        best: tuple[float, int, int] | None = None
        for r in range(self.ranks):
            run = self.running.get(r)
            if run is not None:
                event = (run.end, 0, r) if run.end is not None else (max(t, run.since + run.left / self.rate), 1, r)
            elif self.nxt[r] < len(self.program[r]):
                at = self.start_at(r, self.program[r][self.nxt[r]])
                if at is None:
                    continue
                event = (at, 2, r)
            else:
                continue
            if best is None or event < best:
                best = event
        return best

    def apply(self, event: tuple[float, int, int]) -> None:
        """Take ``event``: an action ends, its compute ends, or a rank starts its next operation."""
        t, what, r = event
        if what == 0:  # the action's host work is done too
            self.finish(r, self.running.pop(r))
        elif what == 1:  # its compute is done; the host work after it is not shared
            run = self.running[r]
            run.end = max(t, run.since + (run.left / self.rate + run.after))
            self.reshare(t, sum(x.end is None for x in self.running.values()))
        else:
            op = self.program[r][self.nxt[r]]
            self.nxt[r] += 1
            work = self.opt[r] if op.kind == "O" else compute_s(op, self.costs[op.stage])
            host = 0.0 if op.kind == "O" else self.overhead.action(op.kind)
            self.reshare(t, sum(x.end is None for x in self.running.values()) + 1)
            self.running[r] = _Running(op, t, work, t, host)

    def inputs_at(self, op: Op) -> float | None:
        """When ``op``'s inputs are all there; ``None``: one is not yet."""
        s, m = op.stage, op.mb
        if op.kind == "F":
            return 0.0 if s == 0 else self.ready.get(("act", s, m))
        if op.kind in ("B", "I"):
            forward = self.done.get(("F", s, m))
            if forward is None:
                return None
            if s == self.last:
                return forward
            grad = self.ready.get(("grad", s, m))
            return None if grad is None else max(forward, grad)
        if op.kind == "W":
            return self.done.get(("I", s, m))
        return 0.0

    def start_at(self, r: int, op: Op) -> float | None:
        """When rank ``r`` can start ``op``: free, inputs arrived, and a message from another rank received."""
        at = self.inputs_at(op)
        if at is None:
            return None
        message = ("act" if op.kind == "F" else "grad", op.stage, op.mb)
        receive = self.overhead.message_s if op.kind in "FBI" and message in self.remote else 0.0
        # The receive is posted once the rank is free and takes message_s to complete a message already there;
        # a message still on its way completes as it arrives, the receive's cost hidden in the wait.
        return max(at, self.now[r] + receive)

    def send(self, kind: str, src_stage: int, dst_stage: int, m: int, at: float, nbytes: int) -> float:
        """Send from ``src_stage`` at ``at``; returns when its sender is free again."""
        src, dst = self.owner[src_stage], self.owner[dst_stage]
        if src == dst:
            self.ready[(kind, dst_stage, m)] = at
            return at
        ln = self.link(src, dst)
        start = max(at, self.link_free.get((src, dst), 0.0))  # posted: gloo's thread sends while the rank goes on
        self.link_free[(src, dst)] = start + ln.busy_s(nbytes)
        self.ready[(kind, dst_stage, m)] = start + ln.busy_s(nbytes) + ln.latency_s + self.overhead.wire_s
        self.remote.add((kind, dst_stage, m))
        self.transfers += 1
        return at + self.overhead.sender_s  # the runtime's own work around the posting occupies the sender

    def reshare(self, t: float, computing: int) -> None:
        """At ``t``, ``computing`` ranks compute from now on: settle the compute done so far if the speed changes.

        Only a change of speed touches the figures, so without sharing an operation ends at exactly its start
        plus its cost.
        """
        new = self.cores.rate(computing) if self.cores is not None else 1.0
        if new != self.rate:
            for run in self.running.values():
                if run.end is None:
                    run.left -= (t - run.since) * self.rate
                    run.since = t
            self.rate = new

    def finish(self, r: int, run: _Running) -> None:
        """``run`` ended: its span, its outputs sent, its memory, and when its rank is free again."""
        op, end = run.op, run.end
        assert end is not None  # finished only once its compute is done
        self.spans.append(Span(r, op, run.start, end))
        if op.kind == "O":
            self.now[r] = end
            return
        self.now[r] = end + self.overhead.gap_s
        cost = self.costs[op.stage]
        self.done[(op.kind, op.stage, op.mb)] = end
        if op.kind == "F":
            self.memory.append((run.start, cost.activation_bytes, r, op.stage))
            if op.stage < self.last:
                self.now[r] = self.send("act", op.stage, op.stage + 1, op.mb, self.now[r], cost.output_bytes)
        elif op.kind in ("B", "I"):
            if op.kind == "B":
                self.memory.append((end, -cost.activation_bytes, r, op.stage))
            if op.stage > 0:
                self.now[r] = self.send("grad", op.stage, op.stage - 1, op.mb, self.now[r],
                                        self.costs[op.stage - 1].output_bytes)
        elif op.kind == "W":  # the weight gradient still reads the stage's saved inputs: freed only now
            self.memory.append((end, -cost.activation_bytes, r, op.stage))


def _result(events: _Events) -> StepResult:
    """What the finished ``events`` add up to: schedule and step time, busy and idle time, memory peaks."""
    ranks, spans, program = events.ranks, events.spans, events.program
    compute = [s for s in spans if s.op.kind != "O"]
    schedule_s = max((s.end for s in compute), default=0.0)
    busy = [0.0] * ranks
    for span in compute:
        busy[span.rank] += span.end - span.start
    after = [0.0 if any(o.kind == "O" for o in program[r]) else events.opt[r] for r in range(ranks)]  # not twice
    step_s = max(max((x.end for x in spans if x.rank == r), default=0.0) + after[r] for r in range(ranks))
    peak_rank, peak_stage = _peaks(events.memory, ranks, len(events.costs))
    return StepResult(step_s, schedule_s, tuple(busy), tuple(schedule_s - b for b in busy), tuple(peak_rank),
                      tuple(peak_stage), tuple(spans), events.transfers, tuple(after))


def _peaks(memory: Sequence[tuple[float, int, int, int]], ranks: int, stages: int) -> tuple[list[int], list[int]]:
    """The most activation memory each rank and each stage held, from the (time, delta, rank, stage) changes."""
    peak_rank, peak_stage = [0] * ranks, [0] * stages
    held_rank, held_stage = [0] * ranks, [0] * stages
    for _, delta, r, s in sorted(memory, key=lambda e: (e[0], e[1])):  # frees before allocations at a tie
        held_rank[r] += delta
        held_stage[s] += delta
        peak_rank[r] = max(peak_rank[r], held_rank[r])
        peak_stage[s] = max(peak_stage[s], held_stage[s])
    return peak_rank, peak_stage


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
