"""The pipeline's books: per rank, what it could do, what it did, and the loss split into parts that add up.

A rank *could do* ``images / c`` per second, ``c`` being its own compute per step: the known compute of every
action it runs (all the model stages it hosts: two under ZBV and the interleaved schedules). Under
``--accelerator sim:R`` that is the device's time of each action, known exactly; on a real device it is the mean
measured busy time of each (stage, kind) of action, which then holds the runtime's own work inside the actions.
The job *did* ``images / T`` per second, ``T`` the measured step (stage 0's input wait + the pipeline's step, timed
whole: from stage 0 holding its batch to the end of the last rank's schedule step, :class:`~stallfree.stage_runtime.
train.report.Report`), so rank ``r`` lost ``1 - c_r / T`` of its time. The known step ``T_known`` is when the last
action of any rank ends in the schedule run with the known compute alone (under the zero-bubble schedules a rank
other than 0 runs the last weight gradients). The loss is written as::

    T - c_r =  warm-up/cool-down_r + imbalance_r             (T_known - c_r: the schedule with the known compute)
             + input + communication + host runtime          (T - T_known: what the measured step adds to it)
             + data-parallel imbalance                       (the wait for the slowest replica, --dp N)
             + padding_r                                     (a token job's compute on slots without a token)

- **warm-up/cool-down**: rank ``r``'s idle in the schedule simulated with the known compute, no link and no
  runtime, every stage capped at ``r``'s own pace (no stage slower than ``r``'s slowest of that kind): the fill and
  drain of the schedule itself;
- **imbalance**: what the stages slower than ``r``'s own add to that idle (0 on the slowest rank; never negative,
  since a step only grows when a stage slows); both are counted until the step's last action ends;
- **input, communication, host runtime**: how much later the measured step ended than the known one, walked back along
  its critical path from the step's last action (of any rank). Each action on it was gated by the later-ending of its
  rank's previous action and the action on another rank whose output it reads. The action's time beyond its known
  compute is **host runtime**; a gap's growth over the same gap in the known schedule (idle the schedule has anyway,
  already in warm-up/cool-down and imbalance) is **communication** after a message-maker on another rank (posting, the
  link, the receive) and **host runtime** after the rank's own action, as is the pipeline step's own set-up and finish
  (the step less the path). Slack in the known schedule (an action that waited there for its other input) absorbs the
  lateness that reaches it, taken back from the parts booked before it in proportion, so neither part is ever
  negative (:mod:`.critical_path`). **input** is stage 0's wait for its batch. These are the job's: every rank's step
  is the same ``T``.

- **data-parallel imbalance**: with ``--dp N``, how much later the slowest replica's pipeline ended than replica
  0's (whose ranks the books read): the gradient all-reduce waits for it, so every rank of replica 0 waits that long.
  Measured per step on the clock the processes of one machine share (0 across machines, where it is not known);
- **padding**: a token job's compute on slots that hold no real token. The books of a token job count real tokens:
  a rank could do its real tokens over its compute on them, ``c_r`` less the padding's share; the padding's share
  of a step is the linear part of its padding slots over the batch's work (:meth:`~stallfree.stage_runtime.models.
  tasks.Task.work`), as the simulated device charges it.

A token job's steps differ in work (documents of other lengths each step): each step's known schedule is the known
one scaled by its work over the mean (replica 0's batch; on a simulated device the known compute is the device's
time of the mean micro-batch), and the micro-batches' differences within a step fall in host runtime, the known
schedule running every micro-batch at the step's mean.

The step is timed whole, to the end of the last action of any rank, so no rank's compute falls after it.

Each part is measured (or known), none is the remainder of the others: they add up to the loss because the path
covers the step exactly and the step's last action is the same action in both schedules. A step that ran ahead of the
known schedule (on a real device, whose known compute is a mean, actions can be faster) nets against the other steps'
communication and runtime, then against the rank's own idle, in proportion.

The same books are read from a simulated step (:func:`predicted_books`: its spans, no input), so that predicted and
measured compare part by part. Clocks are ``time.perf_counter``, one monotonic clock for every process of a machine.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.stage_times import stage_times

from .attribution import steps_from_records
from .costs import FREE_LINK, StageCost, stage_costs
from .critical_path import lateness
from .orders import Op, job_program
from .simulate import Span, StepResult, compute_s, simulate

__all__ = ["ALL_PARTS", "PARTS", "Books", "StepLoad", "job_books", "known_costs", "measured_books", "predicted_books",
           "span_costs"]

PARTS = ("warmup_cooldown", "imbalance", "communication", "runtime", "input")  # every job's
# and the parts that apply to some: data-parallel imbalance with --dp N (replicas), padding for a token job
ALL_PARTS = (*PARTS, "dp_imbalance", "padding")


@dataclass(frozen=True)
class StepLoad:
    """What a step holds besides its spans: the wait for the slowest replica, its work and padding (see the module).

    ``dp_wait_s``: seconds replica 0 waited at the all-reduce for the slowest replica; ``scale``: replica 0's compute
    in the step over the known compute (a token step's work over the mean); ``mean_scale``: the replicas' mean
    compute over the known compute (what a step balanced over the replicas would give each); ``padding``: the share
    of that mean compute on padding slots; ``units``: what the step trained (all replicas: images, or real tokens),
    None for the books' ``images``.
    """

    dp_wait_s: float = 0.0
    scale: float = 1.0
    mean_scale: float = 1.0
    padding: float = 0.0
    units: float | None = None


@dataclass(frozen=True)
class Books:
    """Per rank: could-do images/s, the loss and its parts (shares of the step); the job's are its slowest rank's.

    ``unit``: what the rates count, ``"images"`` or a token job's ``"tokens"`` (real tokens, padding left out: its
    share is a part of the loss); the rates' keys in :meth:`to_dict` are named by it (``images_per_s``,
    ``could_do_tokens_per_s``...).
    """

    images_per_s: float  # what the job did, in units a second
    step_s: float  # mean step
    could_do: tuple[float, ...]  # per rank
    loss: tuple[float, ...]  # per rank, 1 - did / could do
    parts: tuple[dict[str, float], ...]  # per rank, PARTS -> share of the step; they sum to the loss
    steps: int  # steps the books are over
    unit: str = "images"

    @property
    def slowest(self) -> int:
        """The rank with the most compute: the one the job's throughput follows."""
        return min(range(len(self.could_do)), key=lambda r: self.could_do[r])

    def to_dict(self) -> dict[str, Any]:
        """As JSON: ``ranks`` (one entry per rank) and ``job`` (the slowest rank's)."""
        ranks = [{"rank": r, f"could_do_{self.unit}_per_s": self.could_do[r], "loss": self.loss[r],
                  "parts": self.parts[r]} for r in range(len(self.could_do))]
        return {f"{self.unit}_per_s": self.images_per_s, "unit": self.unit, "step_s": self.step_s,
                "steps": self.steps, "job": ranks[self.slowest], "ranks": ranks}


def known_costs(config: TrainConfig, layers: Sequence[LayerTimes], balance: Sequence[int],
                optimizer_s: float = 0.0, work: float | None = None) -> list[StageCost]:
    """Each model stage's compute per micro-batch: the measured layers' own, or the simulated device's.

    Under ``--accelerator sim:R`` the device's times are known exactly (the trainer's split of ``R`` by the same
    measured costs), for a micro-batch of ``work`` (default: its images; a token job's: its tokens' cost).

    The sizes (activations, parameters) and the optimizer's share are the measured layers' in both cases.
    """
    measured = stage_costs(layers, balance, optimizer_s)
    if config.simulation.accelerator is None:
        return measured
    micro = config.pipeline.batch_size // config.pipeline.microbatches if work is None else work
    times = stage_times(config.simulation.accelerator, micro, [c.forward_s + c.backward_s for c in measured])
    return [replace(c, forward_s=t.forward_s, backward_s=t.backward_s, weight_s=t.backward_weight_s)
            for c, t in zip(measured, times, strict=True)]


def span_costs(steps: Sequence[Sequence[Span]], stages: int) -> list[StageCost]:
    """Each stage's mean measured busy time per kind of action, as costs (a real device's 'known' compute)."""
    seen: dict[tuple[int, str], list[float]] = {}
    for spans in steps:
        for span in spans:
            seen.setdefault((span.op.stage, span.op.kind), []).append(span.end - span.start)

    def mean(stage: int, kind: str) -> float:
        values = seen.get((stage, kind), [])
        return sum(values) / len(values) if values else 0.0

    out = []
    for s in range(stages):
        weight = mean(s, "W")
        backward = mean(s, "B") or mean(s, "I") + weight
        out.append(StageCost(mean(s, "F"), backward, weight, 0, 0, 0, 0.0))
    return out


def _idle_split(program: Mapping[int, Sequence[Op]], owner: Sequence[int],
                costs: Sequence[StageCost]) -> tuple[StepResult, list[float], list[dict[str, float]]]:
    """The known-compute step, and per rank its compute and its idle split into parts (seconds).

    The parts: warm-up/cool-down and imbalance, which make ``T_known - c_r``.
    """
    free = lambda a, b: FREE_LINK  # noqa: E731
    ranks = len(program)
    known = simulate(program, owner, costs, free, optimizer_s=[0.0] * ranks)
    compute = [sum(compute_s(op, costs[op.stage]) for op in program[r] if op.kind != "O") for r in range(ranks)]
    whole = any(op.kind == "B" for ops in program.values() for op in ops)  # B, or I and W apart
    step = _end(known)
    parts = []
    for r in range(ranks):
        mine = [costs[s] for s in range(len(owner)) if owner[s] == r]
        capped = simulate(program, owner, [_capped(c, mine, whole) for c in costs], free, optimizer_s=[0.0] * ranks)
        alone = _end(capped)  # no slower than the known step: a step only grows when a stage slows
        parts.append({"warmup_cooldown": alone - compute[r], "imbalance": step - alone})
    return known, compute, parts


def _absorbed(parts: dict[str, float], ahead: float) -> dict[str, float]:
    """``parts`` less ``ahead`` seconds, taken from each in proportion to its size; ``ahead``: what they lacked."""
    held = sum(parts.values())
    taken = min(ahead, held)
    keep = 1 - taken / held if held > 0 else 1.0
    return {**{k: v * keep for k, v in parts.items()}, "ahead": ahead - taken}


def _end(result: StepResult) -> float:
    """When the last compute action of a simulated step ends, on any rank: the step as the trainer times it."""
    return max(s.end for s in result.spans if s.op.kind != "O")


def _capped(cost: StageCost, mine: Sequence[StageCost], whole: bool) -> StageCost:
    """``cost`` with no kind of action slower than the slowest of that kind among ``mine`` (a rank's stages)."""
    forward = min(cost.forward_s, max(c.forward_s for c in mine))
    weight = min(cost.weight_s, max(c.weight_s for c in mine))
    if whole:  # the schedule runs the backward whole: cap it as one
        backward = min(cost.backward_s, max(c.backward_s for c in mine))
        return replace(cost, forward_s=forward, backward_s=backward, weight_s=min(weight, backward))
    inputs = min(cost.input_s, max(c.input_s for c in mine))
    return replace(cost, forward_s=forward, backward_s=inputs + weight, weight_s=weight)


def measured_books(steps: Sequence[Sequence[Span]], step_times: Sequence[tuple[float, float]],
                   program: Mapping[int, Sequence[Op]], owner: Sequence[int], costs: Sequence[StageCost],
                   images: int, unit: str = "images", loads: Sequence[StepLoad] | None = None,
                   replicas: int = 1) -> Books:
    """The books of measured (or simulated) steps.

    Args:
        steps: each step's spans (every rank's compute actions).
        step_times: per step, stage 0's input wait and the pipeline's step, timed whole (seconds).
        program: each rank's operations, in the order it ran them.
        owner: the rank of each model stage.
        costs: each model stage's known compute per micro-batch.
        images: images per step (all replicas), or ``unit``s.
        unit: what ``images`` counts, ``"images"`` or ``"tokens"``.
        loads: per step, its wait for the slowest replica, its scale and padding (default: none, 1 and none).
        replicas: the job's data-parallel replicas. The parts are :data:`PARTS`, "dp_imbalance" with more than one
            replica and "padding" for a token job (each is 0 where it does not apply, and is left out).

    Raises:
        ValueError: no step, or ``steps``, ``step_times`` and ``loads`` of different lengths.
    """
    loads = list(loads) if loads is not None else [StepLoad()] * len(steps)
    if not steps or len(steps) != len(step_times) or len(loads) != len(steps):
        raise ValueError(f"the books need one (wait, step) and one load per step of spans, got {len(steps)} steps of "
                         f"spans, {len(step_times)} step times and {len(loads)} loads")
    known, compute, idle = _idle_split(program, owner, costs)
    total = {"input": 0.0, "communication": 0.0, "runtime": 0.0, "ahead": 0.0, "step": 0.0, "dp_imbalance": 0.0}
    # Over the steps, in known steps: replica 0's compute; the replicas' mean compute on real units and on padding;
    # replica 0's beyond the mean (negative: below it)
    scaled = useful = padded = excess = units = 0.0
    for spans, (wait, pipe), load in zip(steps, step_times, loads, strict=True):
        at = {s.op: replace(s, start=s.start * load.scale, end=s.end * load.scale) for s in known.spans}
        late = lateness([s for s in spans if s.op.kind != "O"], owner, at, pipe)
        for part in ("communication", "runtime", "ahead"):
            total[part] += late[part]
        total["input"] += wait
        total["dp_imbalance"] += load.dp_wait_s
        total["step"] += wait + pipe + load.dp_wait_s
        scaled += load.scale
        useful += load.mean_scale * (1 - load.padding)
        padded += load.mean_scale * load.padding
        excess += load.scale - load.mean_scale
        units += images if load.units is None else load.units
    n, step = len(steps), total["step"]
    # A step ahead of the known one (a real device's actions faster than their mean) nets against the others' delay,
    # then against the rank's own idle and waits: no part is negative (stage_runtime/plan/critical_path.py).
    shared = _absorbed({"communication": total["communication"], "runtime": total["runtime"]}, total["ahead"])
    shown = [*PARTS, *(["dp_imbalance"] if replicas > 1 else []), *(["padding"] if unit == "tokens" else [])]
    could, loss, parts = [], [], []
    for r in range(len(program)):
        could.append(units / (useful * compute[r]) if compute[r] > 0 and useful > 0 else float("inf"))
        loss.append(1 - useful * compute[r] / step)
        # the wait for the slowest replica, and replica 0's own compute beyond the replicas' mean: what a balanced
        # step would not have. Below zero only by the host's noise: then it nets against the rank's other waits.
        dp = total["dp_imbalance"] + excess * compute[r]
        waits = {"input": total["input"], "dp_imbalance": max(dp, 0.0)}
        mine = _absorbed({**{k: scaled * v for k, v in idle[r].items()}, **waits}, shared["ahead"] + max(-dp, 0.0))
        every = {**{k: mine[k] / step for k in idle[r]}, "communication": shared["communication"] / step,
                 "runtime": shared["runtime"] / step, "input": mine["input"] / step,
                 "dp_imbalance": mine["dp_imbalance"] / step, "padding": padded * compute[r] / step}
        parts.append({k: every[k] for k in shown})
    return Books(units / step, step / n, tuple(could), tuple(loss), tuple(parts), n, unit)


def predicted_books(result: StepResult, program: Mapping[int, Sequence[Op]], owner: Sequence[int],
                    costs: Sequence[StageCost], images: int, unit: str = "images") -> Books:
    """The books of a simulated step (no input: the simulator predicts the schedule's step)."""
    spans = [s for s in result.spans if s.op.kind != "O"]
    return measured_books([spans], [(0.0, _end(result))], program, owner, costs, images, unit)



def job_books(config: TrainConfig, balance: Sequence[int], layer_costs: Mapping[str, Any] | None,
              records: Sequence[dict[str, Any]], step_times: Sequence[tuple[float, float]],
              step_loads: Sequence[tuple[float, float, float, float]] | None = None) -> Books | None:
    """The books of a finished ``stallfree train`` job (``config``, a ``TrainConfig``), from what rank 0 holds.

    ``records``: every rank's stage-clock records (replica 0's pipeline ranks are read); ``step_times``: stage 0's
    wait and the pipeline's step of each step this run trained, in order (the clock numbers them 1, 2, ...);
    ``step_loads``: each step's wait for the slowest replica, replica 0's batch's work, the replicas' mean work and
    mean padding slots (``Report.step_loads``; None: no wait, every step alike).
    The first step (warm-up of the processes) is left out when there are others, as the summary's figures do.
    ``None``, with a warning, when the spans do not match the schedule (the clock dropped some); ``None`` for a
    schedule that does not flush (``2bw``: a step is a cut of an endless stream, not one of the simulator's steps).
    """
    if not config.pipeline.spec.flush:
        return None
    program, owner = job_program(config)
    try:  # one list per step of this run, in order: the i-th is the step of step_times[i]
        steps = steps_from_records({r: (f"rank {r}'s spans", records[r]) for r in program}, program, skip=0)
    except ValueError as err:
        warnings.warn(f"no books in the summary: {err}", stacklevel=2)
        return None
    if len(steps) != len(step_times) or not steps:
        warnings.warn(f"no books in the summary: spans of {len(steps)} steps for {len(step_times)} steps trained",
                      stacklevel=2)
        return None
    times = list(step_times)
    raw = list(step_loads) if step_loads is not None else [(0.0, 0.0, 0.0, 0.0)] * len(times)
    if len(steps) > 1:
        steps, times, raw = steps[1:], times[1:], raw[1:]
    loads, mean_work = _loads(config, raw)
    if config.simulation.accelerator is not None and layer_costs is not None:
        micro_work = None if mean_work is None else mean_work / config.pipeline.microbatches
        costs = known_costs(config, [LayerTimes(**t) for t in layer_costs["layers"]], balance,
                            float(layer_costs["optimizer_s"]), work=micro_work)
    else:
        costs = span_costs(steps, len(owner))
    return measured_books(steps, times, program, owner, costs, config.units_per_step, config.unit, loads,
                          config.pipeline.dp)


def _loads(config: TrainConfig,
           raw: Sequence[tuple[float, float, float, float]]) -> tuple[list[StepLoad], float | None]:
    """Each step's :class:`StepLoad`, and replica 0's mean batch work over the steps (the known compute's).

    ``raw``: per step, the wait for the slowest replica, replica 0's work, the replicas' mean work and mean padding
    slots. The mean work is None for images, or where the work is not known: every step's compute alike.
    """
    if config.unit != "tokens" or not raw or not all(work > 0 and mean > 0 for _, work, mean, _ in raw):
        return [StepLoad(dp_wait_s=wait) for wait, *_ in raw], None
    known = sum(work for _, work, _, _ in raw) / len(raw)
    linear, slots, dp = config.model.cost.linear, config.units_per_batch, config.pipeline.dp
    return [StepLoad(dp_wait_s=wait, scale=work / known, mean_scale=mean / known, padding=linear * padding / mean,
                     units=dp * (slots - padding)) for wait, work, mean, padding in raw], known
