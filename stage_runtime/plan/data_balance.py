"""The data side of a token job's plan: how long its replicas wait for each other, and what padding costs.

A token job's step on ``--dp`` replicas lasts as long as its slowest replica: the others wait at the gradient
all-reduce. That wait is the books' "data-parallel imbalance" part, and the compute spent on padding slots their
"padding" part (:mod:`.books`). Both follow from the batches alone: the Loader's plan is a pure function of the
seed, the epoch and the documents' lengths, so the prediction builds each replica's Loader as the job does
(``Packing(seq_len, balance, cost, microbatches)``, shuffled, full batches), takes the epoch's batches, splits each
into its micro-batches in row order (as the trainer does) and charges each what the simulated device charges it
(:meth:`~stallfree.stage_runtime.models.tasks.LanguageModeling.work`: its documents' cost plus the linear part of
every padding slot). No model runs and nothing is timed.

Per step, replica ``r`` computes ``w_r`` (the sum of its micro-batches' work); the step takes ``max w``, of which
``max w - mean w`` is the replicas' wait (averaged over them) and the padding work their mean padding. Summed over
the epoch's steps and divided by ``sum max w``: the shares the books show, before host runtime and input stalls
(which the measured books add, so the measured parts are these times ``1 - those``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from stallfree.core.cost import Cost
from stallfree.pipeline.packing import Packing
from stallfree.stage_runtime.models.tasks import LanguageModeling

__all__ = ["BALANCES", "DataBalance", "predict_data_balance"]

BALANCES = ("none", "tokens", "compute")


@dataclass(frozen=True)
class DataBalance:
    """What one ``--balance-batches`` choice costs a token job's steps (:func:`predict_data_balance`).

    Attributes:
        balance: ``none``, ``tokens`` or ``compute``.
        steps: the epoch's steps.
        dp_imbalance: the replicas' wait for the slowest, as a share of the steps' time.
        padding: the work spent on padding slots, as a share of the steps' time.
        real_tokens: the epoch's real (non-padding) tokens over every replica.
        work: the steps' time in work units (a token's linear cost is 1): ``real_tokens / work`` is the tokens a
            work unit trains, the rate the device's speed multiplies.
        seconds: the time the prediction took (building and reading the Loaders).
    """

    balance: str
    steps: int
    dp_imbalance: float
    padding: float
    real_tokens: int
    work: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"balance": self.balance, "steps": self.steps, "dp_imbalance": self.dp_imbalance,
                "padding": self.padding, "real_tokens": self.real_tokens, "work": self.work, "seconds": self.seconds}


def predict_data_balance(data: str, *, seq_len: int, batch_size: int, dp: int, microbatches: int,
                         attention_span: int | None = None, balances: Sequence[str] = BALANCES, seed: int = 0,
                         epoch: int = 0) -> list[DataBalance]:
    """The data-parallel imbalance and padding of a token job's epoch under each of ``balances``.

    Args:
        data: the job's token source (what ``stallfree train DATA`` reads).
        seq_len: the job's ``--seq-len``.
        batch_size: its ``--batch-size``: rows per replica's step.
        dp: its ``--dp``.
        microbatches: its ``--microbatches``.
        attention_span: the job's ``--attention-span`` (default ``seq_len``): a document of ``l`` tokens costs
            ``l + l**2 / attention_span``.
        balances: the ``--balance-batches`` choices to predict.
        seed: the job's ``--seed``.
        epoch: the epoch to predict.

    Raises:
        ValueError: a balance not in :data:`BALANCES`, or ``batch_size`` not a multiple of ``microbatches``.
    """
    unknown = [b for b in balances if b not in BALANCES]
    if unknown:
        raise ValueError(f"balances must be among {list(BALANCES)}, got {unknown}")
    if batch_size % microbatches:
        raise ValueError(f"batch_size {batch_size} is not a multiple of microbatches {microbatches}")
    cost = Cost.attention(attention_span or seq_len)
    task = LanguageModeling(seq_len, 2, cost)
    return [_predict(data, task, balance, seq_len=seq_len, batch_size=batch_size, dp=dp, microbatches=microbatches,
                     seed=seed, epoch=epoch) for balance in balances]


def _predict(data: str, task: LanguageModeling, balance: str, *, seq_len: int, batch_size: int, dp: int,
             microbatches: int, seed: int, epoch: int) -> DataBalance:
    from stallfree.pipeline.loader import Loader  # DALI is an extra: `stallfree plan` of image models runs without it

    began = time.perf_counter()
    if balance == "none":
        packing = Packing(seq_len=seq_len)
    else:
        by: Literal["tokens", "compute"] = "tokens" if balance == "tokens" else "compute"
        packing = Packing(seq_len=seq_len, balance=by, cost=task.cost, microbatches=microbatches)
    work: list[list[float]] = []  # [replica][step]
    padding: list[list[float]] = []
    real = 0
    for replica in range(dp):
        loader = Loader(data, batch_size, packing=packing, shuffle=True, seed=seed, drop_last=True, rank=replica,
                        world_size=dp)
        loader.set_epoch(epoch)
        steps_work, steps_padding = [], []
        for batch in loader:
            w, p, r = _step(task, batch, microbatches)
            steps_work.append(w)
            steps_padding.append(p)
            real += r
        work.append(steps_work)
        padding.append(steps_padding)
    w_steps, p_steps = np.asarray(work), np.asarray(padding)  # [replicas, steps]: every replica has the same count
    slowest = w_steps.max(axis=0)
    total = float(slowest.sum())
    wait = float((slowest - w_steps.mean(axis=0)).sum())
    return DataBalance(balance, int(w_steps.shape[1]), wait / total if total else 0.0,
                       float(p_steps.mean(axis=0).sum()) / total if total else 0.0, real, total,
                       time.perf_counter() - began)


def _step(task: LanguageModeling, batch: dict[str, torch.Tensor], microbatches: int) -> tuple[float, float, int]:
    """A replica's step: its micro-batches' work, the padding slots' part of it, and its real tokens."""
    inputs = torch.stack([batch["input_ids"], batch["position_ids"], batch["document_index"]], dim=1)
    rows = inputs.shape[0] // microbatches
    work = sum(task.work(inputs[m * rows:(m + 1) * rows]) for m in range(microbatches))
    real = int((batch["document_index"] >= 0).sum())
    pad = inputs.shape[0] * task.seq_len - real
    return work, (task.cost or Cost()).linear * pad, real
