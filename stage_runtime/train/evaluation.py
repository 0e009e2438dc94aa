"""The held-out split's top-1 accuracy, evaluated across a pipeline after each epoch.

Pipeline rank 0 reads the held-out feed and runs the first stages forward; each rank runs its own stages on what
the previous rank sent (:func:`~stallfree.stage_runtime.stage.chain_forward`), and the last stage's rank counts
what it got right (the job's task scores it: an image's class, or a token model's next token). The targets go from
stage 0 to the last stage's rank with their shape first: the last evaluation batch may be short.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from stallfree.stage_runtime.stage import chain_forward
from stallfree.stage_runtime.train.rank import Rank

__all__ = ["evaluate"]


def evaluate(job: Rank) -> float:
    """Top-1 accuracy of the whole held-out split, each replica taking its shard; -1.0 without one.

    The shards are padded to equal length (as ``DistributedSampler`` pads); stage 0 marks the padding's
    labels -1 so that each held-out sample counts once, and the counts are summed over every rank.

    A collective: every rank calls it.
    """
    job.drain()  # 2bw: the weights of every step given so far
    held_out = job.feeds.held_out if job.feeds is not None else None
    has = torch.tensor([1 if held_out is not None else 0], device=job.comm)
    dist.broadcast(has, job.base, group=job.pp_group)
    if not int(has):
        return -1.0
    job.sync_running_stats()
    for m in job.modules.values():
        m.eval()
    correct = torch.zeros(2, dtype=torch.float64)
    batches = iter(held_out) if job.first and held_out is not None else None
    left = job.feeds.held_out_samples if job.first and job.feeds is not None else 0
    rank = len(job.task.target_shape(1))  # the targets' dimensions: labels [B], or a token model's [B, S]
    while True:
        item = next(batches, None) if batches is not None else None
        batch = job.task.batch(item) if item is not None else None
        y = torch.empty(0, dtype=torch.int64)
        if batch is not None:
            y = job.task.drop_rows(batch.targets, left)  # an evaluation shard's padding is not scored
            left -= len(y)
        flag = torch.tensor([0 if (job.first and batch is None) else 1], device=job.comm)
        dist.broadcast(flag, job.base, group=job.pp_group)
        if not int(flag):
            break
        x = batch.inputs.to(job.device) if batch is not None else None
        if job.first and not job.last:  # the shape first: the last evaluation batch may be short
            dist.send(torch.tensor(y.shape, dtype=torch.int64, device=job.comm), job.owner[-1])
            dist.send(y.contiguous().to(job.comm), job.owner[-1])
        elif job.last and not job.first:
            shape = torch.zeros(rank, dtype=torch.int64, device=job.comm)
            dist.recv(shape, job.owner[0])
            y = torch.empty(shape.tolist(), dtype=torch.int64, device=job.comm)
            dist.recv(y, job.owner[0])
        y = y.cpu()
        logits = chain_forward(job.modules, job.config.pipeline.model_stages, job.owner, job.rank, x, job.device)
        if job.last:
            if logits is None:
                raise RuntimeError("chain_forward gave the last stage's rank no logits")
            correct += torch.tensor(job.task.score(logits.cpu(), y), dtype=torch.float64)
    for m in job.modules.values():
        m.train()
    correct = correct.to(job.comm)
    dist.all_reduce(correct)  # every replica's last stage holds its shard's counts
    return float(correct[0] / correct[1]) if correct[1] else 0.0
