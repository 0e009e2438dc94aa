"""stallfree.profile on loaders with planted delays: it names the bottleneck and measures the stall shares."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import stallfree
from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.profile import attribute_stall, profile, verdict


class PlantedLoader:
    """A two-stage pipelined loader (reader thread, one augment thread) with fixed delays per batch.

    It reports spans like stallfree.Loader: "read" and "augment" busy, to ``self.clock`` when set.
    """

    def __init__(self, batches: int, read_s: float, augment_s: float, batch_size: int = 4):
        self.batches, self.read_s, self.augment_s, self.batch_size = batches, read_s, augment_s, batch_size
        self.clock: Any = None

    def _record(self, stage: str, start: float, batch: int) -> None:
        if self.clock is not None:
            self.clock.record(stage, "busy", start, time.perf_counter(), batch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        read_q: queue.Queue[int | None] = queue.Queue(maxsize=2)
        out_q: queue.Queue[int | None] = queue.Queue(maxsize=2)

        def reader() -> None:
            for i in range(self.batches):
                start = time.perf_counter()
                time.sleep(self.read_s)  # a storage read at a fixed rate
                self._record("read", start, i)
                read_q.put(i)
            read_q.put(None)

        def augment() -> None:
            while (i := read_q.get()) is not None:
                start = time.perf_counter()
                time.sleep(self.augment_s)  # a costly augmentation on one thread
                self._record("augment", start, i)
                out_q.put(i)
            out_q.put(None)

        threads = [threading.Thread(target=reader, daemon=True), threading.Thread(target=augment, daemon=True)]
        for t in threads:
            t.start()
        while (i := out_q.get()) is not None:
            yield torch.zeros(self.batch_size, 3), torch.full((self.batch_size,), i)


def _sleep_step(seconds: float) -> Any:
    return lambda batch: time.sleep(seconds)


# (read, augment, step) seconds per batch -> the bottleneck and the planted stall share (slowest input - step) / it.
CASES = [
    pytest.param(0.040, 0.004, 0.010, "fetch", "highly input-bound", id="fetch-bound"),
    pytest.param(0.004, 0.040, 0.010, "preparation", "highly input-bound", id="preparation-bound"),
    pytest.param(0.004, 0.004, 0.040, "compute", "not input-bound", id="compute-bound"),
]


@pytest.mark.parametrize(("read_s", "augment_s", "step_s", "bottleneck", "grade"), CASES)
def test_planted_bottleneck_is_named_and_shares_agree(read_s: float, augment_s: float, step_s: float,
                                                      bottleneck: str, grade: str) -> None:
    loader = PlantedLoader(batches=22, read_s=read_s, augment_s=augment_s)
    result = profile(loader, _sleep_step(step_s), warmup=2)
    slowest_input = max(read_s, augment_s)
    planted = max(0.0, slowest_input - step_s) / max(slowest_input, step_s)
    planted_fetch = planted if read_s > augment_s else 0.0
    planted_prep = planted if augment_s > read_s else 0.0
    assert result.bottleneck == bottleneck, result.report()
    assert result.verdict == grade, result.report()
    assert result.batches == 20 and result.samples == 80
    assert result.stall_share == pytest.approx(planted, abs=0.10), result.report()
    assert result.fetch_stall_share == pytest.approx(planted_fetch, abs=0.10), result.report()
    assert result.prep_stall_share == pytest.approx(planted_prep, abs=0.10), result.report()
    assert set(result.stage_time_per_batch_s) == {"read", "augment"}
    assert loader.clock is None  # the profiler detached its clock


def test_plain_torch_dataloader() -> None:
    class Slow(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            time.sleep(0.003)
            return torch.zeros(3, 8, 8), i

    loader = torch.utils.data.DataLoader(Slow(), batch_size=8, num_workers=2)
    result = stallfree.profile(loader, step=_sleep_step(0.001))
    assert result.batches == 6 and result.samples == 48  # 8 batches, 2 of warm-up
    assert result.bottleneck == "input" and result.verdict == "highly input-bound"
    d = result.to_dict()
    assert d["wait_s"]["p90"] >= d["wait_s"]["p50"] > 0
    assert d["cpu_cores_used"] >= 0


def test_without_step_and_with_a_generator() -> None:
    result = profile((torch.zeros(2, 3) for _ in range(5)), warmup=1, batches=3)
    assert result.verdict == "no step given" and result.batches == 3 and result.samples == 6


def test_spans_go_to_the_clock_given() -> None:
    clock = StageClock()
    profile(PlantedLoader(4, 0.001, 0.001), _sleep_step(0.001), warmup=0, clock=clock)
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

    # 4 samples x 15 ms on one I/O thread: 60 ms per batch to read, against a 5 ms step.
    loader = Loader(_SlowReader(image_folder, 0.015), 4, transform=[Resize((16, 16))], io_threads=1,
                    num_threads=1, drop_last=True)
    result = stallfree.profile(loader, _sleep_step(0.005), warmup=1)
    assert result.bottleneck == "fetch", result.report()
    assert result.verdict == "highly input-bound"
    assert result.fetch_stall_share > result.prep_stall_share
    assert {"read", "augment"} <= set(result.stage_time_per_batch_s)
    assert loader.clock is None
