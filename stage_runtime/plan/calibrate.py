"""Calibrate the simulator on this machine: the gloo link, and the host's cost of torch's schedule runtime.

``ranks`` processes on this machine, over ``torch.distributed``'s gloo backend (the one ``stallfree train`` uses on
CPU), measure two things in one start-up (most of it importing torch in each process):

1. **The link.** Ranks 0 and 1 exchange a small and a large tensor back and forth (ping-pong, the way a pipeline's
   activation and its gradient travel). The large message's extra time over the small one gives the bandwidth:
   ``bytes / (t_large - t_small)`` per direction. The latency is what the near-empty GPipe's messages (below)
   took beyond the sender's gap, where their receive was posted early (it then completes as they arrive): half a
   small round trip is a different path (blocking ``send`` and ``recv``, no schedule) and measured 0.2-2 ms here,
   where the pipeline's messages took 0.1-0.5 ms.
2. **The runtime's overhead.** The ranks are the stages of a model that computes almost nothing (one
   ``Linear(4, 4)`` per model stage, on micro-batches of one row) and run torch's own schedules over it through
   the trainer's own timed stage (``TimedStage``), which records each action as a span on the stage clock:
   ``ScheduleGPipe`` at 2 and 8 micro-batches (forwards and full backwards), then ``ScheduleInterleaved1F1B``
   and ``ScheduleInterleavedZeroBubble`` (forwards, input and weight gradients) with 2 stages per rank at
   2 x ranks. Each step is timed whole, as the trainer times it: from a barrier to the last rank's end. torch
   runs GPipe and 1F1B by a hand-written loop and the others by its action-list runtime, whose costs differ (each
   schedule's ``family`` in the table of schedules, :data:`FAMILIES`): each family's overhead is fitted from its
   own runs. The spans give the overhead (:func:`~.attribution.fit_overhead`): each action kind's busy time
   beyond the layer's compute for that kind (measured by the partitioner's ``measure_layers``), the sender's gap
   after a send, the receive of a message already there; ``step_s`` is then what the measured schedule still
   takes beyond the simulated one, the mean over the runs.

Medians of the schedule steps and of the spans. The measurement runs with the torch threads the trainer gives
each stage process, so that per-action costs are those of the job's processes; with more stage processes than
cores, ``ranks`` of them share the cores as the job's will.
"""

from __future__ import annotations

import functools
import queue as queues
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.models.layer_times import LayerTimes
from stallfree.stage_runtime.models.measure import layer_times
from stallfree.stage_runtime.models.partition import measure_layers
from stallfree.stage_runtime.plan.attribution import Measured, attribute, fit_overhead, steps_from_records
from stallfree.stage_runtime.plan.calibration import FAMILIES, Calibration, PipelineTimes
from stallfree.stage_runtime.plan.costs import HostOverhead, Link, stage_costs
from stallfree.stage_runtime.plan.orders import placement, torch_order
from stallfree.stage_runtime.plan.simulate import simulate
from stallfree.stage_runtime.processes import free_port, stage_threads
from stallfree.stage_runtime.schedules import build_schedule, schedule_spec
from stallfree.stage_runtime.stage import TimedStage

__all__ = ["RUNS", "calibrate_gloo_link", "calibrate_host", "cached_calibration", "fit_pipeline"]

SMALL, LARGE = 1024, 4 * 2**20  # bytes
WIDTH = 4  # the near-empty stages: Linear(WIDTH, WIDTH) on one row per micro-batch
# (schedule, micro-batches per rank count): GPipe's F and B at two counts, zero-bubble's F, I and W
RUNS: tuple[tuple[str, int], ...] = (("gpipe", 2), ("gpipe", 8), ("interleaved-1f1b", 0), ("zero-bubble", 0))


def _microbatches(schedule: str, m: int, ranks: int) -> int:
    return m or 2 * ranks  # 0: twice the ranks (zero-bubble wants a multiple of them)


def _ping_pong(rank: int, repeats: int) -> dict[int, float]:
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


def _near_empty_pipeline(rank: int, ranks: int,
                         steps: int) -> tuple[list[tuple[float, dict[str, Any]]], LayerTimes]:
    """Per run of :data:`RUNS`: the median schedule step (timed whole) and this rank's spans; the layer's compute."""
    torch.manual_seed(rank)
    passes = [layer_times(measure_layers([nn.Linear(WIDTH, WIDTH)], torch.randn(1, WIDTH), repeats=5)[0])
              for _ in range(3)]
    near_empty = LayerTimes(statistics.median(c.forward_s for c in passes),
                            statistics.median(c.backward_s for c in passes),
                            statistics.median(c.weight_s for c in passes), 0, 4 * WIDTH)
    out = []
    for schedule, count in RUNS:
        m = _microbatches(schedule, count, ranks)
        spec = schedule_spec(schedule)
        stages = ranks * spec.stages_per_rank(2)
        clock = StageClock()
        mine = [s for s in range(stages) if spec.owner(s, ranks) == rank]
        layers = [nn.Linear(WIDTH, WIDTH) for _ in mine]
        timed = [TimedStage(layer, s, stages, torch.device("cpu"), clock=clock,
                            input_args=torch.empty(1, WIDTH, device="meta").requires_grad_(s > 0),
                            output_args=torch.empty(1, WIDTH, device="meta").requires_grad_(True))
                 for layer, s in zip(layers, mine, strict=True)]
        runner: Any = build_schedule(schedule, timed, m, nn.functional.cross_entropy)
        first, last = spec.owner(0, ranks) == rank, spec.owner(stages - 1, ranks) == rank
        x, y = torch.randn(m, WIDTH), torch.zeros(m, dtype=torch.int64)
        times = []
        for i in range(steps + 2):  # two untimed: the first step sets up the stage's buffers and connections
            for stage in timed:
                stage.step_number = i
            dist.barrier()  # the ranks start each step together (the trainer's no longer meet between steps)
            start = time.perf_counter()
            if first and last:
                runner.step(x, target=y, losses=[])
            elif first:
                runner.step(x)
            elif last:
                runner.step(target=y, losses=[])
            else:
                runner.step()
            end = time.perf_counter()
            for layer in layers:
                layer.zero_grad(set_to_none=True)
            for stage in timed:
                stage.take_busy()
            if i >= 2:
                times.append((start, end))
        out.append((statistics.median(_whole_steps(times, ranks)), clock.to_records()))
    return out, near_empty


def _whole_steps(times: list[tuple[float, float]], ranks: int) -> list[float]:
    """Each step timed whole, as the trainer times it: from the first rank's start to the last rank's end.

    ``times`` is this rank's (start, end) of each step on ``time.perf_counter``, the one clock the processes of a
    machine share; a collective over every rank (each calls it). Under the zero-bubble schedules the other ranks
    still run weight gradients when rank 0's step returns.
    """
    mine = torch.tensor(times, dtype=torch.float64)
    every = [torch.zeros_like(mine) for _ in range(ranks)]
    dist.all_gather(every, mine)
    stacked = torch.stack(every)  # rank, step, (start, end)
    return (stacked[:, :, 1].max(0).values - stacked[:, :, 0].min(0).values).tolist()


def _worker(rank: int, ranks: int, port: int, repeats: int, steps: int, threads: int, queue: Any) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    try:
        times = _ping_pong(rank, repeats)
        pipeline, layer = _near_empty_pipeline(rank, ranks, steps) if steps else ([], None)
        queue.put((rank, times, pipeline, layer))
    finally:
        dist.destroy_process_group()


def _measure(ranks: int, repeats: int, steps: int,
             threads: int | None) -> tuple[Link, list[PipelineTimes], LayerTimes | None]:
    if ranks < 2:
        raise ValueError(f"calibration needs at least 2 ranks, got {ranks}")
    threads = stage_threads(ranks, threads)  # what the trainer gives each stage process
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, ranks, port, repeats, steps, threads, queue))
             for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        results = sorted(_results(queue, procs, timeout=300), key=lambda row: row[0])
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    times = results[0][1]
    latency = times[SMALL] / 2
    extra = max(times[LARGE] / 2 - latency, 1e-9)
    link = Link((LARGE - SMALL) / extra, latency)
    pipeline = [PipelineTimes(schedule, _microbatches(schedule, count, ranks), results[0][2][i][0],
                              tuple(row[2][i][1] for row in results))
                for i, (schedule, count) in enumerate(RUNS)] if steps else []
    return link, pipeline, results[0][3]


def _results(queue: Any, procs: list[Any], timeout: float) -> list[Any]:
    """One result per process from ``queue``; a process that ended without one fails the calibration at once.

    Raises:
        RuntimeError: a worker died (its rank and exit code; its traceback is on stderr), or ``timeout`` passed.
    """
    results: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(results) < len(procs):
        try:
            results.append(queue.get(timeout=0.5))
            continue
        except queues.Empty:
            pass
        done = {row[0] for row in results}
        for rank, proc in enumerate(procs):
            if rank not in done and proc.exitcode not in (None, 0):  # 0: its result is still on its way
                raise RuntimeError(f"calibration: stage process {rank} exited with code {proc.exitcode} before "
                                   "its measurement (its error is printed above)")
        if time.monotonic() > deadline:
            raise RuntimeError(f"calibration: no result from {len(procs) - len(results)} stage process(es) "
                               f"in {timeout:g} s")
    return results


def calibrate_gloo_link(repeats: int = 20) -> Link:
    """The link between two stage processes on this machine (ping-pong only, as described above)."""
    return _measure(2, repeats, 0, None)[0]


def fit_pipeline(pipeline: Sequence[PipelineTimes], layer: LayerTimes,
                 link: Link) -> tuple[dict[str, HostOverhead], Link, list[dict[str, Any]]]:
    """Per schedule family, the runtime overhead the near-empty pipeline's spans show; the link; each run's figures.

    The link keeps ``link``'s bandwidth (the ping-pong's large message) and takes the latency GPipe's messages
    showed (:func:`~.attribution.fit_overhead`).

    ``pipeline`` holds the runs of :data:`RUNS` (their ranks: as many as each has records), one
    ``Linear(WIDTH, WIDTH)`` per model stage; ``layer`` is that layer's compute per pass. Per kind, send and
    message: :func:`~.attribution.fit_overhead` over the family's runs; ``step_s``: the measured schedule step
    less the simulated one with that overhead, the mean over the family's runs.

    Raises:
        ValueError: no run, or a run whose spans do not match torch's order (the message says where).
    """
    if not pipeline:
        raise ValueError("fitting the overhead needs at least one run of the near-empty pipeline")
    runs, shown = [], []
    for p in pipeline:
        ranks = len(p.records)
        per_rank = schedule_spec(p.schedule).stages_per_rank(2)  # as _near_empty_pipeline built it
        order = torch_order(p.schedule, ranks, p.microbatches, per_rank)
        owner = placement(p.schedule, ranks, ranks * per_rank)
        records = {r: (f"calibration {p.schedule} M={p.microbatches} rank {r}", rec) for r, rec in enumerate(p.records)}
        steps = steps_from_records(records, order, skip=2)
        costs = stage_costs([layer] * len(owner), [1] * len(owner))
        runs.append((p, order, Measured(steps, owner, costs)))
        shown.append(attribute(steps, owner).to_dict())
    _, latency_s = fit_overhead([m for p, _, m in runs if FAMILIES[p.schedule] == "loop"] or
                                [m for _, _, m in runs], link)
    link = Link(link.bytes_per_s, latency_s)  # what GPipe's messages waited for take beyond the sender's gap
    overheads = {}
    for family in dict.fromkeys(FAMILIES[p.schedule] for p in pipeline):
        mine = [run for run in runs if FAMILIES[run[0].schedule] == family]
        overhead, _ = fit_overhead([m for _, _, m in mine], link)
        step_s = statistics.fmean(p.schedule_s - simulate(order, m.owner, m.costs, lambda a, b: link,
                                                          overhead=overhead).schedule_s for p, order, m in mine)
        overheads[family] = replace(overhead, step_s=max(0.0, step_s))
    return overheads, link, shown


def calibrate_host(ranks: int = 2, repeats: int = 20, steps: int = 10, threads: int | None = None) -> Calibration:
    """Measure the link and the runtime's overhead with ``ranks`` gloo processes on this machine (see above).

    ``threads``: torch threads per process (default: the trainer's, cores / ranks).

    Raises:
        ValueError: fewer than 2 ranks.
    """
    link, pipeline, layer = _measure(ranks, repeats, steps, threads)
    if layer is None:
        raise ValueError(f"calibration needs at least 1 step of the near-empty pipeline, got steps={steps}")
    overheads, link, shown = fit_pipeline(pipeline, layer, link)
    return Calibration(link, overheads, ranks, layer.forward_s + layer.backward_s, tuple(pipeline), tuple(shown))


@functools.lru_cache(maxsize=8)
def cached_calibration(ranks: int = 2, threads: int | None = None) -> Calibration:
    """:func:`calibrate_host`, measured once per process for each ``(ranks, threads)``."""
    return calibrate_host(ranks, threads=threads)
