"""``stallfree.profile(loader, step)``: how long the training loop waits for input, and which stage makes it wait.

Works on any iterable of batches, a ``torch.utils.data.DataLoader`` included. The loop is timed from the
consumer's side: ``wait`` is the time ``next(loader)`` took, ``step`` the time ``step(batch)`` took. Their sum is the
step time, and ``wait`` over it is the *stall share* that TensorFlow's input-pipeline analyzer grades: under 5% not
input-bound, 5-20% moderately, over 20% highly.

A loader that reports stage spans (it has a ``clock`` attribute, as :class:`stallfree.Loader` has) also says which
input stage the stall comes from. Each stage's *time per batch* is per batch of the stage itself: the length of
the union of the busy spans it finished inside the timed loop, over the number of batches those spans worked on
(so a stage run by 8 workers in parallel counts once, not 8 times, and a stage that ran ahead of the loop, or
behind it, is not divided by the loop's own batch count). The stages are pipelined, so the loop runs at the pace
of the slowest one. Following DS-Analyzer's differential
definitions (Mohan et al., VLDB 2021)::

    prep stall  = max(0, t_prep - t_step)                          # what remains if fetching were free
    fetch stall = max(0, max(t_fetch, t_prep) - t_step) - prep stall

and the measured wait is split between the two in that proportion.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from stallfree.core.atomic import atomic_write
from stallfree.stage_runtime.clock import Span, StageClock, percentile
from stallfree.stage_runtime.profile.loader_chart import draw_loader_profile
from stallfree.stage_runtime.profile.sampler import ResourceSampler

__all__ = ["FETCH_STAGES", "PREP_STAGES", "LoaderProfile", "attribute_stall", "profile", "verdict"]

FETCH_STAGES = ("read", "fetch")
PREP_STAGES = ("augment", "decode", "prep", "h2d")

Verdict = Literal["not input-bound", "moderately input-bound", "highly input-bound"]
Bottleneck = Literal["fetch", "preparation", "compute", "input"]


def verdict(stall_share: float) -> Verdict:
    """TensorFlow input-pipeline analyzer's grade of a stall share (0..1): <5%, 5-20%, >20%."""
    if not 0 <= stall_share <= 1:
        raise ValueError(f"stall_share must be in [0, 1], got {stall_share}")
    if stall_share < 0.05:
        return "not input-bound"
    return "moderately input-bound" if stall_share <= 0.20 else "highly input-bound"


def _union(spans: list[Span], start: float, end: float) -> float:
    """Length of the union of the spans' intervals clipped to ``[start, end]``."""
    intervals = sorted((max(s.start, start), min(s.end, end)) for s in spans)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in intervals:
        if b <= a:
            continue
        if cur_b is None or a > cur_b:
            if cur_b is not None and cur_a is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None and cur_a is not None:
        total += cur_b - cur_a
    return total


def attribute_stall(t_fetch: float, t_prep: float, t_step: float) -> tuple[float, float]:
    """The modelled fetch and preparation stalls per batch (seconds) of a pipelined loader; see the module doc."""
    prep = max(0.0, t_prep - t_step)
    return max(0.0, max(t_fetch, t_prep) - t_step) - prep, prep


@runtime_checkable
class Timed(Protocol):
    """A loader whose passes report their stages' spans to a clock given when the pass starts (``stallfree.Loader``)."""

    def iterate(self, clock: StageClock) -> Iterator[Any]:
        """A pass reporting to ``clock``."""
        ...


@dataclass(frozen=True)
class LoaderProfile:
    """What :func:`profile` measured. Shares are fractions of the step time (wait + step), 0..1."""

    batches: int
    samples: int
    wall_s: float
    wait_s: list[float]
    step_s: list[float]
    stall_share: float
    fetch_stall_share: float
    prep_stall_share: float
    verdict: Verdict | Literal["no step given"]
    bottleneck: Bottleneck
    stage_time_per_batch_s: dict[str, float]  # union of the stage's busy spans / the batches they worked on
    stage_utilization: dict[str, float]  # union of busy spans inside the loop / its wall time
    cpu_cores_used: float  # mean CPU seconds per second of this process and its workers
    clock: StageClock = field(repr=False, compare=False)
    sampler: ResourceSampler = field(repr=False, compare=False)

    @property
    def samples_per_s(self) -> float:
        """Samples delivered per second over the measured batches."""
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    def wait_percentiles(self) -> dict[str, float]:
        """p50/p90/p99/max of the per-batch wait, seconds."""
        return {"p50": percentile(self.wait_s, 50), "p90": percentile(self.wait_s, 90),
                "p99": percentile(self.wait_s, 99), "max": max(self.wait_s, default=0.0)}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (the ``real_run`` part of ``profile.json``; see docs/profile.md)."""
        return {
            "batches": self.batches, "samples": self.samples, "wall_s": self.wall_s,
            "samples_per_s": self.samples_per_s,
            "wait_s": {"total": sum(self.wait_s), "mean": statistics.fmean(self.wait_s) if self.wait_s else 0.0,
                       **self.wait_percentiles()},
            "step_s": {"total": sum(self.step_s), "mean": statistics.fmean(self.step_s) if self.step_s else 0.0},
            "stall_share": self.stall_share, "fetch_stall_share": self.fetch_stall_share,
            "prep_stall_share": self.prep_stall_share, "verdict": self.verdict, "bottleneck": self.bottleneck,
            "stage_time_per_batch_s": self.stage_time_per_batch_s, "stage_utilization": self.stage_utilization,
            "cpu_cores_used": self.cpu_cores_used,
        }

    def save(self, folder: str | os.PathLike[str]) -> list[Path]:
        """Write ``profile.json``, ``trace.json`` and ``profile.png`` to ``folder``.

        ``profile.json`` is :meth:`to_dict`; ``trace.json`` the clock's spans (open it in https://ui.perfetto.dev);
        ``profile.png`` each stage's time per batch beside the step's, and the wait of every timed batch.

        Returns:
            the three paths.
        """
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        result = self.to_dict()
        atomic_write(out / "profile.json", json.dumps(result, indent=2).encode())
        self.clock.to_chrome_trace(out / "trace.json")
        return [out / "profile.json", out / "trace.json", draw_loader_profile(result, self.wait_s, out / "profile.png")]

    def report(self) -> str:
        """A few human lines."""
        w = self.wait_percentiles()
        lines = [
            f"{self.batches} batches, {self.samples_per_s:.1f} samples/s, stall {self.stall_share:.1%} of step time "
            f"({self.verdict}); bottleneck: {self.bottleneck}",
            f"  fetch stall {self.fetch_stall_share:.1%}, preparation stall {self.prep_stall_share:.1%}; wait per "
            f"batch p50 {w['p50'] * 1e3:.1f} ms, p90 {w['p90'] * 1e3:.1f} ms, max {w['max'] * 1e3:.1f} ms",
            f"  CPU: {self.cpu_cores_used:.2f} cores used by this process and its workers",
        ]
        if self.stage_time_per_batch_s:
            stages = ", ".join(f"{k} {v * 1e3:.1f} ms ({self.stage_utilization[k]:.0%} busy)"
                               for k, v in self.stage_time_per_batch_s.items())
            lines.append(f"  time per batch of each stage (parallel workers counted once): {stages}; the step "
                         f"{statistics.fmean(self.step_s) * 1e3 if self.step_s else 0.0:.1f} ms")
        return "\n".join(lines)


def _batch_len(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    try:
        return len(first)
    except TypeError:
        return 1


def profile(
    loader: Iterable[Any],
    step: Callable[[Any], Any] | None = None,
    *,
    batches: int | None = None,
    warmup: int = 2,
    clock: StageClock | None = None,
    sample_interval: float = 0.1,
    progress: Callable[[int], None] | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> LoaderProfile:
    """Profile any iterable loader: wait per batch, its distribution, the stall share against ``step``.

    Args:
        loader: any iterable of batches (``stallfree.Loader``, ``torch.utils.data.DataLoader``, a generator).
            When it has a ``clock`` attribute that is ``None``, it is pointed at the profiler's clock for the run,
            so that the stall can be attributed to its stages.
        step: called on each batch (the training step); without it only the wait is measured.
        batches: how many batches to time after the warm-up (default: until the loader is exhausted).
        warmup: batches taken first and not timed (pipeline build, worker start-up).
        clock: the clock to record into (default: a new one). The profiler adds ``wait`` (waiting) and
            ``step`` (busy) spans for the consumer's side.
        sample_interval: seconds between psutil samples.
        progress: called with 1 after each timed batch (e.g. ``tqdm.update``).
        timer: the clock the loop is timed with, in seconds; the loader's spans must come from the same one
            (``time.perf_counter``, as :class:`stallfree.Loader`'s do). Tests pass a simulated one.

    Returns:
        a :class:`LoaderProfile`.

    Raises:
        ValueError: bad ``batches``/``warmup``, or the loader yields no batch after the warm-up.
    """
    if batches is not None and batches < 1:
        raise ValueError(f"batches must be >= 1 or None, got {batches}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    clock = clock if clock is not None else StageClock()
    waits: list[float] = []
    steps: list[float] = []
    samples = 0
    sampler = ResourceSampler(sample_interval)
    sampler.phase = "real run"
    # a stallfree Loader's pass reports its stages' spans to the clock it is built with; another loader is timed
    iterator = loader.iterate(clock) if isinstance(loader, Timed) else iter(loader)
    try:
        with sampler:
            for _ in range(warmup):
                batch = next(iterator, None)
                if batch is None:
                    break
                if step is not None:
                    step(batch)
            start = timer()
            index = 0
            while batches is None or index < batches:
                t0 = timer()
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                t1 = timer()
                if step is not None:
                    step(batch)
                t2 = timer()
                clock.record("wait", "waiting", t0, t1, index)
                if step is not None:
                    clock.record("step", "busy", t1, t2, index)
                waits.append(t1 - t0)
                steps.append(t2 - t1)
                samples += _batch_len(batch)
                index += 1
                if progress is not None:
                    progress(1)
            end = timer()
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
    if not waits:
        raise ValueError(f"the loader yielded no batch after {warmup} warm-up batches; lower warmup= or check it")
    return _analyse(waits, steps, samples, start, end, clock, sampler, step is not None)


def _analyse(waits: list[float], steps: list[float], samples: int, start: float, end: float, clock: StageClock,
             sampler: ResourceSampler, has_step: bool) -> LoaderProfile:
    n = len(waits)
    wall = end - start
    total_wait = sum(waits)
    loop = total_wait + sum(steps)
    stall = total_wait / loop if loop > 0 else 0.0
    per_batch: dict[str, float] = {}
    utilization: dict[str, float] = {}
    for stage in clock.stages():
        if stage in ("wait", "step"):
            continue
        # the spans finished inside the loop (stages of other runs in the same clock lie outside it)
        busy = [s for s in clock.spans(stage) if s.state == "busy" and start < s.end <= end]
        whole = _union(busy, -math.inf, math.inf)
        if whole > 0:
            handled = len({s.batch for s in busy if s.batch is not None}) or len(busy)
            per_batch[stage] = whole / handled
            utilization[stage] = _union(busy, start, end) / wall if wall > 0 else 0.0
    t_fetch = sum(per_batch.get(s, 0.0) for s in FETCH_STAGES)
    # Preparation stages run one after another in one graph thread per batch, so their times add.
    t_prep = sum(per_batch.get(s, 0.0) for s in PREP_STAGES)
    t_step = statistics.fmean(steps) if has_step else 0.0
    fetch_model, prep_model = attribute_stall(t_fetch, t_prep, t_step)
    fetch_share = prep_share = 0.0
    if fetch_model + prep_model > 0:
        fetch_share = stall * fetch_model / (fetch_model + prep_model)
        prep_share = stall * prep_model / (fetch_model + prep_model)
    bottleneck: Bottleneck
    if has_step and stall < 0.05:
        bottleneck = "compute"
    elif fetch_model + prep_model == 0:
        bottleneck = "input"
    else:
        bottleneck = "fetch" if fetch_model >= prep_model else "preparation"
    window = sampler.between(start, end) or sampler.samples
    cores = statistics.fmean(s.process_cores for s in window) if window else 0.0
    return LoaderProfile(
        batches=n, samples=samples, wall_s=wall, wait_s=waits, step_s=steps, stall_share=stall,
        fetch_stall_share=fetch_share, prep_stall_share=prep_share,
        verdict=verdict(min(1.0, stall)) if has_step else "no step given", bottleneck=bottleneck,
        stage_time_per_batch_s=per_batch, stage_utilization=utilization, cpu_cores_used=cores, clock=clock,
        sampler=sampler,
    )
