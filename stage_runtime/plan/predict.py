"""The simulator's prediction for one training job, for the trainer's report beside what it measured.

``stallfree train`` prints the measured bubble; the schedule's textbook theory leaves out communication, uneven
stages and the optimizer step, so this module predicts the job's own step instead: the same model measured by
the partitioner's measurement (``measure_model``) at the job's micro-batch, cut by the job's balance, ordered as
torch's schedule runs it, over one link model. It runs in the command's process after training, with the torch
threads each stage process had.
"""

from __future__ import annotations

import os
from typing import Any

from stallfree.stage_runtime.plan.costs import Link, parse_link, stage_costs
from stallfree.stage_runtime.plan.orders import placement, torch_order
from stallfree.stage_runtime.plan.simulate import simulate_step

__all__ = ["DEFAULT_LINK", "predict_training"]

DEFAULT_LINK = "25GB/s,5us"  # stallfree plan's default


def predict_training(config: Any, balance: tuple[int, ...], num_classes: int,
                     link: Link | None = None) -> dict[str, Any]:
    """Predicted step time, images/s and bubble (split into causes) of ``config`` (a ``TrainConfig``).

    ``balance`` is the split the job ran; ``link`` defaults to :data:`DEFAULT_LINK`.
    """
    import torch

    from stallfree.stage_runtime.plan.measure import measure_model
    from stallfree.stage_runtime.train.models import build_model

    link = link or parse_link(DEFAULT_LINK)
    micro = config.batch_size // config.microbatches
    per_rank = config.spec.stages_per_rank(config.virtual_stages)
    previous = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(config.threads or max(1, cores // min(config.world_size, cores)))
    try:
        torch.manual_seed(config.seed)
        model = build_model(config.model, num_classes, config.image_size, **config.model_kwargs)
        layers, optimizer_s = measure_model(model, config.image_size, micro)
    finally:
        torch.set_num_threads(previous)  # process-wide: leave it as we found it
    costs = stage_costs(layers, balance, optimizer_s)
    order = torch_order(config.schedule, config.stages, config.microbatches, per_rank)
    owner = placement(config.schedule, config.stages, config.stages * per_rank)
    result = simulate_step(order, owner, costs, lambda a, b: link, causes=True)
    assert result.bubble is not None  # causes=True splits it
    return {"step_s": result.step_s, "images_per_s": config.batch_size * config.dp / result.step_s,
            "bubble": result.bubble.total, "causes": result.bubble.to_dict(), "link": link.describe()}
