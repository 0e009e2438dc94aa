"""stallfree.profile on loaders with planted delays: it names the bottleneck and measures the stall shares."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import stallfree
from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.profile.loop import attribute_stall, profile, verdict


class SimulatedTime:
    """A clock that moves only when told: the loop's timings are then exact, whatever else the machine runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> Callable[[Any], None]:
        """A training step that takes ``seconds``."""
        def run(batch: Any) -> None:
            self.now += seconds
        return run


class PlantedLoader:
    """A two-stage pipelined loader (one reader, one augmenter, ``depth`` batches in flight) on simulated time.

    Batch ``i`` is read once the reader is free and batch ``i - depth`` was taken (a bounded queue), augmented
    once read and the augmenter is free; taking it waits (moves the time on) until it is ready. It reports
    "read" and "augment" busy spans to the clock its pass is given (``iterate``), as stallfree.Loader does.
    """

    def __init__(self, sim: SimulatedTime, batches: int, read_s: float, augment_s: float, batch_size: int = 4,
                 depth: int = 2):
        self.sim, self.batches, self.read_s, self.augment_s = sim, batches, read_s, augment_s
        self.batch_size, self.depth = batch_size, depth
        self.clock: Any = None

    def iterate(self, clock: Any) -> Iterator[Any]:
        """A pass reporting to ``clock``, as stallfree.Loader's ``iterate`` does (the profiler's way in)."""
        self.clock = clock
        return iter(self)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        read_end = augment_end = 0.0
        taken: list[float] = []
        for i in range(self.batches):
            free = taken[i - self.depth] if i >= self.depth else 0.0
            read_start = max(read_end, free)
            read_end = read_start + self.read_s
            augment_start = max(augment_end, read_end, free)
            augment_end = augment_start + self.augment_s
            self.sim.now = max(self.sim.now, augment_end)
            taken.append(self.sim.now)
            if self.clock is not None:
                self.clock.record("read", "busy", read_start, read_end, i)
                self.clock.record("augment", "busy", augment_start, augment_end, i)
            yield torch.zeros(self.batch_size, 3), torch.full((self.batch_size,), i)


# (read, augment, step) seconds per batch -> the bottleneck, the grade, and the exact shares of the step time:
# the loop waits (slowest input - step) per batch once the pipeline is full, and the stall is all one stage's.
CASES = [
    pytest.param(0.040, 0.004, 0.010, "fetch", "highly input-bound", 0.75, 0.0, id="fetch-bound"),
    pytest.param(0.004, 0.040, 0.010, "preparation", "highly input-bound", 0.0, 0.75, id="preparation-bound"),
    pytest.param(0.004, 0.004, 0.040, "compute", "not input-bound", 0.0, 0.0, id="compute-bound"),
    pytest.param(0.012, 0.004, 0.010, "fetch", "moderately input-bound", 2 / 12, 0.0, id="moderately"),
]


@pytest.mark.parametrize(("read_s", "augment_s", "step_s", "bottleneck", "grade", "fetch", "prep"), CASES)
def test_planted_bottleneck_is_named_and_shares_are_exact(read_s: float, augment_s: float, step_s: float,
                                                          bottleneck: str, grade: str, fetch: float,
                                                          prep: float) -> None:
    sim = SimulatedTime()
    loader = PlantedLoader(sim, batches=22, read_s=read_s, augment_s=augment_s)
    result = profile(loader, sim.step(step_s), warmup=2, timer=sim)
    assert result.bottleneck == bottleneck, result.report()
    assert result.verdict == grade, result.report()
    assert result.batches == 20 and result.samples == 80
    assert result.stall_share == pytest.approx(fetch + prep, abs=1e-9)
    assert result.fetch_stall_share == pytest.approx(fetch, abs=1e-9)
    assert result.prep_stall_share == pytest.approx(prep, abs=1e-9)
    wait = max(0.0, max(read_s, augment_s) - step_s)
    assert result.wait_percentiles() == pytest.approx({"p50": wait, "p90": wait, "p99": wait, "max": wait})
    assert result.step_s == pytest.approx([step_s] * 20)
    assert set(result.stage_time_per_batch_s) == {"read", "augment"}


class TwoReaders(PlantedLoader):
    """The same loader with each read also reported by a second reader thread, overlapping the first."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in super().__iter__():
            if self.clock is not None:
                first = [s for s in self.clock.spans("read") if s.batch == int(batch[1][0])][-1]
                self.clock.record("read", "busy", (first.start + first.end) / 2, first.end, first.batch)
            yield batch


def test_a_stage_run_by_several_threads_counts_once() -> None:
    # Each stage's time per batch is the union of its spans, so overlapping reads on two threads count once.
    results = []
    for kind in (PlantedLoader, TwoReaders):
        sim = SimulatedTime()
        results.append(profile(kind(sim, 12, 0.040, 0.004), sim.step(0.010), warmup=2, timer=sim))
    one, two = results
    assert two.stage_time_per_batch_s == pytest.approx(one.stage_time_per_batch_s)
    assert two.fetch_stall_share == pytest.approx(one.fetch_stall_share)


def test_plain_torch_dataloader() -> None:
    sim = SimulatedTime()

    class Slow(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            sim.now += 0.003  # 3 ms a sample, in the loop's own thread (num_workers=0)
            return torch.zeros(3, 8, 8), i

    loader = torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=0)
    result = stallfree.profile(loader, step=sim.step(0.001), timer=sim)
    assert result.batches == 6 and result.samples == 48  # 8 batches, 2 of warm-up
    # No stage spans from a DataLoader: the wait is measured but not attributed to a stage.
    assert result.bottleneck == "input" and result.stage_time_per_batch_s == {}
    assert result.stall_share == pytest.approx(0.024 / 0.025) and result.verdict == "highly input-bound"
    assert result.fetch_stall_share == result.prep_stall_share == 0.0
    d = result.to_dict()
    assert d["wait_s"]["p50"] == d["wait_s"]["max"] == pytest.approx(0.024)
    assert d["wait_s"]["total"] == pytest.approx(6 * 0.024) and d["wall_s"] == pytest.approx(6 * 0.025)
    assert d["samples_per_s"] == pytest.approx(48 / 0.15)


def test_without_step_and_with_a_generator() -> None:
    result = profile((torch.zeros(2, 3) for _ in range(5)), warmup=1, batches=3)
    assert result.verdict == "no step given" and result.batches == 3 and result.samples == 6


def test_spans_go_to_the_clock_given() -> None:
    clock, sim = StageClock(), SimulatedTime()
    profile(PlantedLoader(sim, 4, 0.001, 0.001), sim.step(0.001), warmup=0, clock=clock, timer=sim)
    assert {"read", "augment", "wait", "step"} <= set(clock.summary())
    assert clock.summary()["step"].busy_count == 4


def test_attribution_model() -> None:
    assert attribute_stall(0.03, 0.01, 0.01) == pytest.approx((0.02, 0.0))
    assert attribute_stall(0.01, 0.03, 0.01) == pytest.approx((0.0, 0.02))
    assert attribute_stall(0.04, 0.03, 0.01) == pytest.approx((0.01, 0.02))
    assert attribute_stall(0.01, 0.01, 0.05) == (0.0, 0.0)


@pytest.mark.parametrize(("share", "grade"), [(0.0, "not input-bound"), (0.049, "not input-bound"),
                                              (0.05, "moderately input-bound"), (0.2, "moderately input-bound"),
                                              (0.21, "highly input-bound")])
def test_verdict_thresholds(share: float, grade: str) -> None:
    assert verdict(share) == grade


@pytest.mark.parametrize(("kwargs", "match"), [({"batches": 0}, "batches must be >= 1"),
                                               ({"warmup": -1}, "warmup must be >= 0")])
def test_bad_arguments(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        profile([torch.zeros(1)], **kwargs)  # type: ignore[arg-type]


def test_empty_loader_is_an_error() -> None:
    with pytest.raises(ValueError, match="yielded no batch after 2 warm-up batches"):
        profile([torch.zeros(1)])


class _SlowReader:
    """stallfree's FolderReader with every read slowed by a fixed delay: storage at a fixed rate."""

    def __init__(self, root: Any, delay_s: float):
        from stallfree.pipeline.readers import FolderReader

        self.inner, self.delay_s = FolderReader(root), delay_s
        self.classes, self.encoded, self.columns = self.inner.classes, True, ()
        self.column = self.inner.column

    def __len__(self) -> int:
        return len(self.inner)

    def labels(self) -> Any:
        return self.inner.labels()

    def read(self, index: int) -> Any:
        time.sleep(self.delay_s)
        return self.inner.read(index)

    def describe(self, index: int) -> str:
        return self.inner.describe(index)


def test_real_loader_with_a_slowed_reader_is_fetch_bound(image_folder: Any) -> None:
    from stallfree import Loader
    from stallfree.transforms import Resize

    # The Loader's own spans come from time.perf_counter, so this one runs on real time; the margin is wide
    # (4 samples x 30 ms on one I/O thread, 120 ms per batch to read, against a step that does nothing) and
    # nothing is asserted about a duration. It guards the augment span that once covered the wait for the
    # reader's samples and named a fetch-bound run preparation-bound.
    loader = Loader(_SlowReader(image_folder, 0.030), 4, transform=[Resize((16, 16))], io_threads=1,
                    num_threads=1, drop_last=True)
    result = stallfree.profile(loader, lambda batch: None, warmup=1)
    assert result.bottleneck == "fetch", result.report()
    assert result.fetch_stall_share > result.prep_stall_share
    assert result.fetch_stall_share + result.prep_stall_share == pytest.approx(result.stall_share)
    assert {"read", "augment"} <= set(result.stage_time_per_batch_s)
    assert loader.options.run.clock is None  # the profiler gave its clock to the pass, not to the Loader
