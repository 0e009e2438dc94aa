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

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from stallfree.core.cost import Cost
from stallfree.pipeline.packing import Packing
from stallfree.stage_runtime.models.gpt import boundary_documents, document_lengths
from stallfree.stage_runtime.models.tasks import LanguageModeling

__all__ = ["BALANCES", "DataBalance", "fit_cost", "predict_data_balance", "replica_steps"]

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
    began = time.perf_counter()
    packing = _packing(seq_len, balance, task.cost or Cost(), microbatches)
    work: list[list[float]] = []  # [replica][step]
    padding: list[list[float]] = []
    real = 0
    for replica in range(dp):
        loader = _job_loader(data, batch_size, packing, seed=seed, replica=replica, dp=dp, epoch=epoch)
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
    made = task.batch(batch)  # stage 0's input, as the trainer makes it
    inputs, real = made.inputs, made.samples
    rows = inputs.shape[0] // microbatches
    work = sum(task.work(inputs[m * rows:(m + 1) * rows]) for m in range(microbatches))
    pad = inputs.shape[0] * task.seq_len - real
    return work, (task.cost or Cost()).linear * pad, real


def replica_steps(data: str, *, seq_len: int, batch_size: int, balance: str, cost: Cost, microbatches: int, dp: int,
                  replica: int = 0, seed: int = 0, epoch: int = 0) -> list[list[int]]:
    """Each step's documents on ``replica``, as the job's Loader makes them.

    A document is its length; a split document's piece counts as a document of its own, and a padding slot as a
    document of one token (a device charges it its linear part).
    """
    task = LanguageModeling(seq_len, 2, cost)
    loader = _job_loader(data, batch_size, _packing(seq_len, balance, cost, microbatches), seed=seed, replica=replica,
                         dp=dp, epoch=epoch)
    steps = []
    for batch in loader:
        inputs = task.batch(batch).inputs
        lengths = document_lengths(boundary_documents(inputs)).tolist()
        steps.append(lengths + [1] * (inputs.shape[0] * seq_len - sum(lengths)))
    return steps


def fit_cost(run_dir: str | Path, data: str) -> tuple[Cost, int]:
    """The :class:`~stallfree.core.cost.Cost` that best explains a finished token job's measured steps.

    Reads the job's settings from ``run_dir/summary.json`` and pairs each step of ``run_dir/train.jsonl`` (its
    ``compute_step_s``: replica 0's own step, its wait for the other replicas left out) with replica 0's documents
    of that step, made again from ``data`` as the job's Loader made them; then fits by non-negative least squares
    (:meth:`Cost.fit`). Returns the cost (seconds per token, per token squared) and the number of steps fitted.
    The host's fixed cost per step has no term of its own: it lands in the linear one.

    Raises:
        FileNotFoundError: ``run_dir`` lacks ``summary.json`` or ``train.jsonl`` (not a finished job's folder).
        ValueError: not a token job, too few steps, or times that do not grow with the documents.
    """
    folder = Path(run_dir)
    for name in ("summary.json", "train.jsonl"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} does not exist: give the --out folder of a finished "
                                    "stallfree train job")
    config = json.loads((folder / "summary.json").read_text()).get("config", {})
    if config.get("model") != "gpt_tiny":
        raise ValueError(f"{folder} is a job of --model {config.get('model')}: a cost is fitted to a token job's "
                         "steps (--model gpt_tiny)")
    seq_len = int(config["seq_len"])
    planned = Cost.attention(int(config.get("attention_span") or seq_len))  # the cost the job's balance planned by

    def steps_of(epoch: int) -> list[list[int]]:
        return replica_steps(data, seq_len=seq_len, batch_size=int(config["batch_size"]), dp=int(config["dp"]),
                             balance=str(config.get("balance_batches") or "none"), cost=planned,
                             microbatches=int(config["microbatches"]), seed=int(config.get("seed") or 0), epoch=epoch)
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines() if line.strip()]
    by_epoch: dict[int, list[list[int]]] = {}
    documents, seconds = [], []
    for row in rows:
        if "compute_step_s" not in row:
            continue
        epoch = int(row.get("epoch", 0))
        steps = by_epoch.get(epoch)
        if steps is None:
            steps = by_epoch[epoch] = steps_of(epoch)
        if steps:
            documents.append(steps[(int(row["step"]) - 1) % len(steps)])
            seconds.append(float(row["compute_step_s"]))
    return Cost.fit(documents, seconds), len(seconds)


def _job_loader(data: str, batch_size: int, packing: Packing, *, seed: int, replica: int, dp: int, epoch: int) -> Any:
    """A replica's Loader as a token job's training feed builds it (shuffled, full batches), at ``epoch``."""
    from stallfree.pipeline.loader import Loader  # DALI is an extra: `stallfree plan` of image models runs without it

    loader = Loader(data, batch_size, packing=packing, shuffle=True, seed=seed, drop_last=True, rank=replica,
                    world_size=dp)
    loader.set_epoch(epoch)
    return loader


def _packing(seq_len: int, balance: str, cost: Cost, microbatches: int) -> Packing:
    if balance == "none":
        return Packing(seq_len=seq_len)
    by: Literal["tokens", "compute"] = "tokens" if balance == "tokens" else "compute"
    return Packing(seq_len=seq_len, balance=by, cost=cost, microbatches=microbatches)
