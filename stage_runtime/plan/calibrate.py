"""Calibrate the simulator on this machine: the gloo link, and the host's cost of torch's schedule runtime.

``ranks`` processes on this machine, over ``torch.distributed``'s gloo backend (the one ``stallfree train`` uses on
CPU), measure two things in one start-up (most of it importing torch in each process):

1. **The link.** Ranks 0 and 1 exchange a small and a large tensor back and forth (ping-pong, the way a pipeline's
   activation and its gradient travel). Half the round trip of the small message is the latency; the large
   message's extra time over it gives the bandwidth: ``bytes / (t_large - t_small)`` per direction.
2. **The runtime's overhead.** The ranks are the stages of a model that computes almost nothing (one
   ``Linear(4, 4)`` each, on micro-batches of one row) and run torch's ``ScheduleGPipe`` over it at
   ``MICROBATCHES`` micro-batch counts, through the trainer's own timed stage (``TimedStage``): rank 0 times
   ``schedule.step`` and every rank its busy time, as the trainer does. Whatever an action costs beyond the
   layer's compute (measured by the partitioner's ``measure_layers``) is torch's runtime. :func:`fit_overhead`
   turns that into a :class:`~.costs.HostOverhead`:

   - ``action_s``: busy time per action less the layer's compute per action (median over ranks and counts);
   - ``message_s``: found by bisection so that the simulated schedule grows from the fewest micro-batches to the
     most as the measured one does (each micro-batch adds messages, not steps);
   - ``step_s``: what the measured schedule still takes beyond the simulated one, the mean over the counts.

Medians of the repeats throughout. The measurement runs with the torch threads the trainer gives each stage
process, so that per-action costs are those of the job's processes; with more stage processes than cores,
``ranks`` of them share the cores as the job's will.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stallfree.stage_runtime.plan.costs import HostOverhead, LayerTimes, Link, stage_costs

__all__ = ["MICROBATCHES", "Calibration", "PipelineTimes", "calibrate_gloo_link", "calibrate_host",
           "cached_calibration", "fit_overhead"]

SMALL, LARGE = 1024, 4 * 2**20  # bytes
WIDTH = 4  # the near-empty stages: Linear(WIDTH, WIDTH) on one row per micro-batch
MICROBATCHES = (2, 8)  # GPipe runs any count; the difference between the two is what messages cost


@dataclass(frozen=True)
class PipelineTimes:
    """The near-empty pipeline at one micro-batch count: medians over the timed steps."""

    microbatches: int
    schedule_s: float  # rank 0's schedule.step, as the trainer times it
    busy_s: tuple[float, ...]  # per rank, inside the timed stage's chunks


@dataclass(frozen=True)
class Calibration:
    """What this machine measured: the link, the runtime's overhead, and the figures they were fitted from."""

    link: Link
    overhead: HostOverhead
    ranks: int
    layer_s: float  # the near-empty layer's forward + backward, by the partitioner's measurement
    pipeline: tuple[PipelineTimes, ...]

    def to_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {"link": self.link.describe(), "overhead": self.overhead.to_dict(), "ranks": self.ranks,
                "layer_s": self.layer_s,
                "pipeline": [{"microbatches": p.microbatches, "schedule_s": p.schedule_s, "busy_s": list(p.busy_s)}
                             for p in self.pipeline]}


def _ping_pong(rank: int, repeats: int) -> dict[int, float]:
    import torch
    import torch.distributed as dist

    times = {}
    for nbytes in (SMALL, LARGE):
        x = torch.zeros(nbytes // 4)
        rounds = []
        for i in range(repeats + 2):  # two untimed: connection set-up and first-touch
            start = time.perf_counter()
            if rank == 0:
                dist.send(x, 1)
                dist.recv(x, 1)
            elif rank == 1:
                dist.recv(x, 0)
                dist.send(x, 0)
            if i >= 2:
                rounds.append(time.perf_counter() - start)
        times[nbytes] = statistics.median(rounds) if rank < 2 else 0.0
    return times


def _near_empty_pipeline(rank: int, ranks: int, steps: int) -> tuple[list[PipelineTimes], float]:
    """This rank's medians at each of :data:`MICROBATCHES`, and the layer's measured compute (rank 0's)."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import ScheduleGPipe

    from stallfree.stage_runtime.train.partition import measure_layers
    from stallfree.stage_runtime.train.stage import TimedStage

    torch.manual_seed(rank)
    layer = nn.Linear(WIDTH, WIDTH)
    layer_s = statistics.median(measure_layers([layer], torch.randn(1, WIDTH), repeats=5)[0].time_s
                                for _ in range(3))
    out = []
    for m in MICROBATCHES:
        inp = torch.empty(1, WIDTH, device="meta").requires_grad_(rank > 0)
        stage = TimedStage(layer, rank, ranks, torch.device("cpu"), input_args=inp,
                           output_args=torch.empty(1, WIDTH, device="meta").requires_grad_(True))
        schedule = ScheduleGPipe(stage, m, loss_fn=nn.functional.cross_entropy)
        x, y = torch.randn(m, WIDTH), torch.zeros(m, dtype=torch.int64)
        walls, busy = [], []
        for i in range(steps + 2):  # two untimed: the first step sets up the stage's buffers and connections
            dist.barrier()  # the trainer's ranks meet once a step too (its all-reduce of the step's figures)
            start = time.perf_counter()
            if rank == 0:
                schedule.step(x)
            elif rank == ranks - 1:
                schedule.step(target=y, losses=[])
            else:
                schedule.step()
            wall = time.perf_counter() - start
            layer.zero_grad(set_to_none=True)
            if i >= 2:
                walls.append(wall)
                busy.append(stage.take_busy())
            else:
                stage.take_busy()
        out.append(PipelineTimes(m, statistics.median(walls), (statistics.median(busy),)))
    return out, layer_s


def _worker(rank: int, ranks: int, port: int, repeats: int, steps: int, threads: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    try:
        times = _ping_pong(rank, repeats)
        pipeline, layer_s = _near_empty_pipeline(rank, ranks, steps) if steps else ([], 0.0)
        queue.put((rank, times, pipeline, layer_s))
    finally:
        dist.destroy_process_group()


def _measure(ranks: int, repeats: int, steps: int, threads: int | None) -> tuple[Link, list[PipelineTimes], float]:
    import torch.multiprocessing as mp

    from stallfree.stage_runtime.train.launcher import free_port

    if ranks < 2:
        raise ValueError(f"calibration needs at least 2 ranks, got {ranks}")
    cores = len(os.sched_getaffinity(0))
    threads = threads or max(1, cores // min(ranks, cores))  # what the trainer gives each stage process
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, ranks, port, repeats, steps, threads, queue))
             for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        results = sorted((queue.get(timeout=180) for _ in procs), key=lambda row: row[0])
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    times = results[0][1]
    latency = times[SMALL] / 2
    extra = max(times[LARGE] / 2 - latency, 1e-9)
    link = Link((LARGE - SMALL) / extra, latency)
    pipeline = [PipelineTimes(p.microbatches, p.schedule_s, tuple(row[2][i].busy_s[0] for row in results))
                for i, p in enumerate(results[0][2])]
    return link, pipeline, results[0][3]


def calibrate_gloo_link(repeats: int = 20) -> Link:
    """The link between two stage processes on this machine (ping-pong only, as described above)."""
    return _measure(2, repeats, 0, None)[0]


def fit_overhead(pipeline: Sequence[PipelineTimes], layer_s: float, link: Link) -> HostOverhead:
    """The runtime's overhead that makes the simulator reproduce the near-empty pipeline's measured steps.

    ``pipeline`` holds GPipe's figures at two or more micro-batch counts, on as many ranks as ``busy_s`` has,
    one ``Linear(WIDTH, WIDTH)`` stage each; ``layer_s`` is that layer's forward + backward.

    Raises:
        ValueError: fewer than two micro-batch counts.
    """
    from stallfree.stage_runtime.plan.orders import torch_order
    from stallfree.stage_runtime.plan.simulate import simulate

    if len({p.microbatches for p in pipeline}) < 2:
        raise ValueError(f"fitting the overhead needs two micro-batch counts or more, got "
                         f"{[p.microbatches for p in pipeline]}")
    ranks = len(pipeline[0].busy_s)
    # Busy per action: M forwards and M backwards per rank, each its layer's share plus the runtime's.
    per_action = [b / (2 * p.microbatches) for p in pipeline for b in p.busy_s]
    action_s = max(0.0, statistics.median(per_action) - layer_s / 2)
    layer = LayerTimes(layer_s / 3, 2 * layer_s / 3, layer_s / 3, 0, 4 * WIDTH)
    costs = stage_costs([layer] * ranks, [1] * ranks)

    def simulated(m: int, message_s: float) -> float:
        order = torch_order("gpipe", ranks, m)
        return simulate(order, list(range(ranks)), costs, lambda a, b: link,
                        overhead=HostOverhead(action_s, message_s)).schedule_s

    few, most = min(pipeline, key=lambda p: p.microbatches), max(pipeline, key=lambda p: p.microbatches)
    measured = most.schedule_s - few.schedule_s

    def growth(message_s: float) -> float:
        return simulated(most.microbatches, message_s) - simulated(few.microbatches, message_s)

    lo, hi = 0.0, max(measured, 1e-6)
    if growth(lo) >= measured:
        message_s = 0.0
    else:
        while growth(hi) < measured and hi < 10.0:  # each micro-batch adds at least one message: soon above
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if growth(mid) < measured else (lo, mid)
        message_s = (lo + hi) / 2
    step_s = max(0.0, statistics.fmean(p.schedule_s - simulated(p.microbatches, message_s) for p in pipeline))
    return HostOverhead(action_s, message_s, step_s)


def calibrate_host(ranks: int = 2, repeats: int = 20, steps: int = 10, threads: int | None = None) -> Calibration:
    """Measure the link and the runtime's overhead with ``ranks`` gloo processes on this machine (see above).

    ``threads``: torch threads per process (default: the trainer's, cores / ranks).

    Raises:
        ValueError: fewer than 2 ranks.
    """
    link, pipeline, layer_s = _measure(ranks, repeats, steps, threads)
    return Calibration(link, fit_overhead(pipeline, layer_s, link), ranks, layer_s, tuple(pipeline))


@functools.lru_cache(maxsize=8)
def cached_calibration(ranks: int = 2, threads: int | None = None) -> Calibration:
    """:func:`calibrate_host`, measured once per process for each ``(ranks, threads)``."""
    return calibrate_host(ranks, threads=threads)
