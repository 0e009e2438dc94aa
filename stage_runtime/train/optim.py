"""The optimizer and its learning-rate schedule: ``--optimizer``, ``--lr``, ``--lr-schedule``, ``--warmup-steps``.

The learning rate at optimizer step ``s`` (0-based: the rate the ``s``-th step uses) of a run of ``total`` steps::

    warm-up, s < warmup:   lr * (s + 1) / warmup                       (linear, reaching lr at the last warm-up step)
    then, constant:        lr
    then, cosine:          lr * (1 + cos(pi * (s - warmup) / (total - warmup))) / 2   (from lr towards 0)

Every rank of a pipeline builds its own optimizer over its stages' parameters with the same rule, so the stages
step in lockstep; a checkpoint keeps the schedule's position with the optimizer's state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from stallfree.stage_runtime.config.train_config import LR_SCHEDULES, OPTIMIZERS

__all__ = ["build_optimizer", "build_scheduler", "lr_factor"]


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """The learning rate of optimizer step ``step`` (0-based) over ``--lr``; see the module's text."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        span = max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, span) / span))
    raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {schedule!r}")


def build_optimizer(params: Iterable[Any], name: str, *, lr: float, momentum: float, weight_decay: float) -> Any:
    """``torch.optim.SGD`` (with ``momentum``) or ``torch.optim.AdamW`` (torch's betas and eps) over ``params``."""
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def build_scheduler(optimizer: Any, *, total: int, warmup: int, schedule: str) -> Any:
    """A ``LambdaLR`` that sets the rate of each step by :func:`lr_factor`; call its ``step()`` after each step."""
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, warmup, schedule))
