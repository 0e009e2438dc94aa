"""Asynchronous (no-flush) pipelines, simulated; ``stallfree train --schedule 2bw`` runs ``pipedream-2bw``.

The trainer's runner (``train/two_bw.py``) has the same order, update points and version rule as the simulation
of ``pipedream-2bw``; ``async-1f1b`` is simulated only.

Both run 1F1B without a flush between steps: the order is torch's own 1F1B loop over the micro-batches of
``steps`` steps in a row, so a rank starts the next step's forwards while the last ranks still run this step's
backwards, and the warm-up and cool-down are paid once instead of every step. What that costs is weights::

    pipedream-2bw   each stage updates after every M of its backwards (one optimizer step per step, with
                    gradients accumulated); a forward keeps the version it ran with until its backward (two
                    versions at most, double-buffered: PipeDream-2BW, Narayanan et al. 2021)
    async-1f1b      each stage updates after every backward, and the backward uses the current weights, not the
                    ones its forward used (one version; PipeMare and XPipe correct the mismatch by scaling the
                    learning rate or predicting the weights)

Staleness is counted from the simulated trace, per stage: how many updates the stage applied between the
version a micro-batch's forward read and the update its gradient goes into.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.stage_times import stage_times

from .costs import FREE_LINK, Cores, Link, StageCost, stage_costs
from .orders import Op, torch_order
from .simulate import StepResult, simulate

__all__ = ["ASYNC_SCHEDULES", "AsyncName", "AsyncResult", "predict_simulated_job", "simulate_async"]

AsyncName = Literal["pipedream-2bw", "async-1f1b"]
ASYNC_SCHEDULES: tuple[str, ...] = ("pipedream-2bw", "async-1f1b")
STATE_COPIES = 3  # weights, gradients, momentum (as the synchronous planner counts them)


@dataclass(frozen=True)
class AsyncResult:
    """The steady state of a no-flush schedule over ``steps`` steps of ``microbatches`` each."""

    name: str
    ranks: int
    microbatches: int
    batch: int
    step_s: float  # per step in the steady state (after the first pipeline fill)
    weight_versions: tuple[int, ...]  # per stage, the most versions alive at once
    staleness: tuple[int, ...]  # per stage, the most updates between the weights read and those updated
    memory_bytes: tuple[int, ...]  # per rank: weight versions, gradients, momentum, peak activations
    result: StepResult

    @property
    def images_per_s(self) -> float:
        """Images per second in the steady state."""
        return self.batch / self.step_s if self.step_s > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        """As ``plan.json`` writes it."""
        return {"schedule": self.name, "stages": self.ranks, "microbatches": self.microbatches,
                "step_s": self.step_s, "images_per_s": self.images_per_s,
                "weight_versions": list(self.weight_versions), "staleness_steps": list(self.staleness),
                "memory_bytes": list(self.memory_bytes), "simulated_only": self.name != "pipedream-2bw"}


def _program(name: str, ranks: int, microbatches: int, steps: int) -> dict[int, list[Op]]:
    order = torch_order("1f1b", ranks, microbatches * steps)
    program: dict[int, list[Op]] = {}
    for r, ops in order.items():
        mine: list[Op] = []
        backwards = 0
        for op in ops:
            mine.append(op)
            if op.kind == "B":
                backwards += 1
                if name == "async-1f1b" or backwards % microbatches == 0:
                    mine.append(Op(op.stage, "O", backwards))
        program[r] = mine
    return program


def simulate_async(name: str, ranks: int, microbatches: int, batch: int, costs: Sequence[StageCost],
                   link: Callable[[int, int], Link], steps: int = 6, cores: Cores | None = None) -> AsyncResult:
    """Simulate ``steps`` steps of ``name`` without a flush, one model stage per rank (sharing ``cores`` if given).

    Raises:
        ValueError: an unknown name, fewer than 3 steps, or a stage count that is not the rank count.
    """
    if name not in ASYNC_SCHEDULES:
        raise ValueError(f"unknown asynchronous schedule {name!r}; choose one of {', '.join(ASYNC_SCHEDULES)}")
    if steps < 3:
        raise ValueError(f"steps must be >= 3 to see a steady state, got {steps}")
    if len(costs) != ranks:
        raise ValueError(f"asynchronous schedules hold one stage per rank: got {len(costs)} stages, {ranks} ranks")
    program = _program(name, ranks, microbatches, steps)
    result = simulate(program, list(range(ranks)), costs, link, optimizer_s=[c.optimizer_s for c in costs],
                      cores=cores)
    by_rank: dict[int, list[Any]] = {r: [] for r in range(ranks)}
    for span in result.spans:
        by_rank[span.rank].append(span)
    # A step is done when stage 0 has run the backward (and update) of its last micro-batch.
    done = [0.0] * steps
    for span in by_rank[0]:
        if span.op.kind in ("B", "O"):
            k = (span.op.mb if span.op.kind == "B" else span.op.mb - 1) // microbatches
            done[k] = max(done[k], span.end)
    # From the middle to the step before the last: the last step's backwards run back to back (no forward of a
    # next step between them), so its end comes early and would flatter the steady state.
    half = steps // 2
    step_s = (done[-2] - done[half - 1]) / (steps - 1 - half)
    versions, stale = [], []
    for r in range(ranks):
        spans = by_rank[r]
        updates = [s.end for s in spans if s.op.kind == "O"]
        read = {s.op.mb: sum(u <= s.start for u in updates) for s in spans if s.op.kind == "F"}
        worst, most = 0, 1
        for s in spans:
            if s.op.kind != "B":
                continue
            m = s.op.mb
            # The update this gradient goes into: the next one, or the one closing its step (2BW).
            after = [i for i, u in enumerate(updates) if u >= s.end]
            if name == "pipedream-2bw":
                closing = (m // microbatches + 1) * microbatches
                after = [i for i, o in enumerate(x for x in spans if x.op.kind == "O") if o.op.mb == closing]
            if after and m >= microbatches:  # the first step fills the pipeline: not the steady state
                worst = max(worst, after[0] - read[m])
            if name == "pipedream-2bw":  # versions alive while this micro-batch is in flight
                in_flight = {read[x.op.mb] for x in spans if x.op.kind == "F" and x.start <= s.start
                             and x.op.mb in read and not any(y.op.kind == "B" and y.op.mb == x.op.mb
                                                              and y.end <= s.start for y in spans)}
                current = sum(u <= s.start for u in updates)
                most = max(most, len(in_flight | {current}))
        versions.append(most)
        stale.append(worst)
    memory = [(versions[r] + STATE_COPIES - 1) * costs[r].param_bytes + result.peak_activation_bytes[r]
              for r in range(ranks)]
    return AsyncResult(name, ranks, microbatches, batch, step_s, tuple(versions), tuple(stale), tuple(memory),
                       result)


def predict_simulated_job(config: TrainConfig, summary: Mapping[str, Any], steps: int = 8,
                          link: Link = FREE_LINK) -> dict[str, Any]:
    """2BW's steady state and 1F1B's step, simulated for a ``--accelerator sim:R`` job (``config``, a ``TrainConfig``).

    The job's split, ranks, micro-batches and batch are simulated, each stage taking the simulated device's time
    per micro-batch: the trainer's (``SimAccelerator.stage_times`` over each stage's measured cost, the summary's
    ``layer_costs`` summed by its ``balance``; a token job's micro-batch of the summary's mean ``micro_batch_work``),
    and the optimizer its measured share. Steps and images/s include
    the optimizer (2BW updates inside its pipeline, 1F1B after its schedule); the link defaults to free and the
    host's own costs (the runtime, the trainer's per-step collective) are left out.

    Raises:
        ValueError: not a ``sim:R`` job with one stage per rank, or a summary without its layer costs.
    """
    accelerator = config.simulation.accelerator  # a SimAccelerator: TrainConfig parsed the string
    p = config.pipeline
    if accelerator is None or summary.get("layer_costs") is None or p.model_stages != p.stages:
        raise ValueError("predict_simulated_job needs a --accelerator sim:R job with one stage per rank (gpipe, "
                         "1f1b or 2bw) and its summary's layer_costs")
    ranks, m, batch = config.pipeline.stages, config.pipeline.microbatches, config.pipeline.batch_size
    layers = [LayerTimes(**layer) for layer in summary["layer_costs"]["layers"]]
    measured = stage_costs(layers, summary["balance"], float(summary["layer_costs"]["optimizer_s"]))
    work = summary.get("micro_batch_work") or batch // m  # a token job's mean micro-batch cost, or its images
    device = stage_times(accelerator, work, [c.forward_s + c.backward_s for c in measured])
    costs = [StageCost(t.forward_s, t.backward_s, t.backward_weight_s, c.activation_bytes, c.output_bytes,
                       c.param_bytes, c.optimizer_s) for t, c in zip(device, measured, strict=True)]
    two_bw = simulate_async("pipedream-2bw", ranks, m, batch, costs, lambda a, b: link, steps=steps)
    one_f = simulate(torch_order("1f1b", ranks, m), list(range(ranks)), costs, lambda a, b: link)
    busy = sum(m * (c.forward_s + c.backward_s) for c in costs)  # per step, all ranks: the stages' timed chunks
    # 2BW's updates run inside its step (idle to the stages' timing); 1F1B's optimizer step after its schedule.
    return {"2bw": {**two_bw.to_dict(), "bubble": 1 - busy / (ranks * two_bw.step_s)},
            "1f1b": {"schedule_s": one_f.schedule_s, "step_s": one_f.step_s, "images_per_s": batch / one_f.step_s,
                     "bubble": 1 - busy / (ranks * one_f.schedule_s)}}
