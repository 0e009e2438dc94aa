"""The simulator's prediction for one training job, for the trainer's report beside what it measured.

``stallfree train`` prints the measured bubble; the schedule's textbook theory leaves out communication, uneven
stages, the optimizer step and torch's own runtime, so this module predicts the job's own step instead: the same
model measured by the partitioner's measurement (``measure_model``) at the job's micro-batch, cut by the job's
balance, ordered as torch's schedule runs it, over the link and with the runtime's per-action, per-message and
per-step host overhead calibrated on this machine (:mod:`.calibrate`; a CPU job only, the calibration measures gloo).
A CPU job's stage processes share this machine's cores, each computing on the torch threads the trainer gave it
(cores / processes, at least 1): with more processes than cores, their compute is stretched while more of them
compute at once than the cores hold (:class:`~.costs.Cores`). It runs in the command's process after training,
with the torch threads each stage process had.

The step it predicts is the one the trainer measures: the pipeline's step, timed whole, to the end of the last
compute action on any rank (the optimizer step runs after it, outside the trainer's step time and bubble);
``step_with_optimizer_s`` adds the slowest rank's optimizer.
"""

from __future__ import annotations

import os
from dataclasses import asdict, replace
from typing import Any

import torch

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.models.measure import measure_model
from stallfree.stage_runtime.models.tasks import make_task
from stallfree.stage_runtime.models.zoo import build_model
from stallfree.stage_runtime.plan.attribution import attribute
from stallfree.stage_runtime.plan.books import known_costs, predicted_books
from stallfree.stage_runtime.plan.calibrate import cached_calibration
from stallfree.stage_runtime.plan.costs import DEFAULT_LINK, NO_OVERHEAD, Cores, HostOverhead, Link, parse_link
from stallfree.stage_runtime.plan.orders import job_program
from stallfree.stage_runtime.plan.simulate import simulate_step
from stallfree.stage_runtime.processes import stage_threads

__all__ = ["job_cores", "predict_training"]


def job_cores(config: TrainConfig) -> Cores | None:
    """The cores a ``TrainConfig``'s stage processes share on this machine, as the simulator should share them.

    The processes of a CPU job share this machine's cores, each with the trainer's torch threads; a GPU job's
    compute, and a simulated accelerator's waits, hold none (``None``). The replicas of ``--dp`` are not
    simulated, so their share of the cores is not either.
    """
    if config.processes.device.startswith("cuda") or config.simulation.accelerator is not None:
        return None
    cores = len(os.sched_getaffinity(0))
    return Cores(cores, stage_threads(config.pipeline.world_size, config.processes.threads, cores))


def predict_training(config: TrainConfig, balance: tuple[int, ...], num_classes: int, link: Link | None = None,
                     overhead: HostOverhead | None = None,
                     measured: tuple[list[LayerTimes], float] | None = None,
                     share_cores: bool = True, work: float | None = None) -> dict[str, Any]:
    """Predicted step time, images/s and bubble (split into causes) of ``config`` (a ``TrainConfig``).

    ``balance`` is the split the job ran. Without ``link`` a CPU job calibrates the link and the runtime's overhead
    on this machine (:func:`~.calibrate.cached_calibration`: one start of the stage processes, once per stage count);
    a GPU job takes :data:`~.costs.DEFAULT_LINK` and no overhead. ``overhead`` given replaces the calibrated one.
    ``measured``: the per-layer times and optimizer seconds the job already measured (the trainer's rank 0 does,
    to split the model); without it the model is built and measured here. ``share_cores``: a CPU job's stage
    processes share this machine's cores (``False``: predict as if each had cores of its own). ``work``: a micro-batch's
    work on a simulated device (default: its images; a token job's: its tokens' cost, the trainer's mean).

    Beside the step it returns what the simulated spans show per action kind (``per_action_s``: mean busy seconds
    of one F, B, I, W), per message (``per_message_s``) and per send (``send_s``), as
    :func:`~.attribution.attribute` reads them from the trainer's measured spans.
    """
    p, m = config.pipeline, config.model
    fitted = overhead is not None  # given: fitted for this job (pilots), not the calibration's
    threads = stage_threads(p.world_size, config.processes.threads)
    source = "given" if link is not None else "default"
    if link is None and not config.processes.device.startswith("cuda"):
        calibration = cached_calibration(max(2, p.stages), threads)  # one stage: its actions' cost still
        link, overhead, source = calibration.link, overhead or calibration.overhead(p.schedule), "calibrated"
    link = link or parse_link(DEFAULT_LINK)
    overhead = overhead or NO_OVERHEAD
    if measured is not None:
        layers, optimizer_s = measured
    else:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            torch.manual_seed(config.seed)
            model = build_model(m.name, num_classes, m.image_size, **m.factory_kwargs())
            task = make_task(m.kind, image_size=m.image_size, seq_len=m.packed_len, outputs=num_classes,
                             patch=m.vision)
            layers, optimizer_s = measure_model(model, m.image_size, p.micro_batch,
                                                sample=task.example(p.micro_batch))
        finally:
            torch.set_num_threads(previous)  # process-wide: leave it as we found it
    costs = known_costs(config, layers, balance, optimizer_s, work=work)
    if config.simulation.accelerator is not None and not fitted:
        # The calibration's per-action overhead is the CPU runtime's around real compute; a simulated stage waits its
        # time from the chunk's start, so the runtime's work falls inside the wait (pilots run under sim:R fit what
        # is left, and are given as ``overhead``).
        overhead = replace(overhead, action_s=0.0, kind_s=())
    order, owner = job_program(config)
    sharing = job_cores(config) if share_cores else None
    delay, base = config.simulation.link_delay, link  # a pair's delay adds to its link's latency
    links = ((lambda a, b: base) if delay is None else
             (lambda a, b: replace(base, latency_s=base.latency_s + delay.seconds(a, b))))
    result = simulate_step(order, owner, costs, links, causes=True, overhead=overhead, cores=sharing)
    assert result.bubble is not None  # causes=True splits it
    shown = attribute([list(result.spans)], owner)
    books = predicted_books(result, order, owner, costs, config.units_per_step, config.unit)
    return {"books": books.to_dict(),
            "per_action_s": shown.per_action_s, "per_message_s": shown.per_message_s, "send_s": shown.send_s,
            "step_s": result.schedule_s, "step_with_optimizer_s": result.step_s,
            f"{config.unit}_per_s": config.units_per_step / result.schedule_s,
            "bubble": result.bubble.total, "causes": result.bubble.to_dict(),
            "link": link.describe() + ("" if delay is None else f", --link-delay {delay}"),
            "link_source": source, "overhead": overhead.to_dict(),
            "cores": None if sharing is None else asdict(sharing)}

