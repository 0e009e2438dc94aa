"""A stage's time per batch is per batch of the stage itself (issue 35, item 6: "augment 479.3 ms (92% busy)" beside
a step of about 6 ms): neither batches prepared before the timed loop nor batches prepared ahead of it are divided
by the loop's own batch count."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from stallfree.stage_runtime.profile.loop import profile


class Sim:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> Callable[[Any], None]:
        def run(batch: Any) -> None:
            self.now += seconds
        return run


class AheadLoader:
    """One augmenting thread, ``depth`` batches in flight: each batch takes ``augment_s`` and starts as soon as the
    thread is free and the queue has room, so with a slow step the first ``depth`` batches are ready at once."""

    def __init__(self, sim: Sim, batches: int, augment_s: float, depth: int):
        self.sim, self.batches, self.augment_s, self.depth = sim, batches, augment_s, depth
        self.clock: Any = None

    def iterate(self, clock: Any) -> Iterator[Any]:
        """A pass reporting to ``clock``, as stallfree.Loader's ``iterate`` does (the profiler's way in)."""
        self.clock = clock
        return iter(self)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        free_at, taken = 0.0, []
        for i in range(self.batches):
            start = max(free_at, taken[i - self.depth] if i >= self.depth else 0.0)
            free_at = start + self.augment_s
            self.sim.now = max(self.sim.now, free_at)
            taken.append(self.sim.now)
            if self.clock is not None:
                self.clock.record("augment", "busy", start, free_at, i)
            yield torch.zeros(2, 3), torch.zeros(2)


@pytest.mark.parametrize("depth", [1, 8])
def test_time_per_batch_is_the_stages_own_whatever_ran_ahead(depth: int) -> None:
    sim = Sim()
    result = profile(AheadLoader(sim, 14, augment_s=0.002, depth=depth), sim.step(0.040), warmup=2, timer=sim)
    # Dividing by the timed loop's 12 batches, depth 8 gave 2 ms x 4 batches augmented inside it / 12 = 0.67 ms.
    assert result.stage_time_per_batch_s["augment"] == pytest.approx(0.002)
    # the busy share of the loop's wall time counts only what it did inside the loop (depth 8: most was before)
    assert 0 < result.stage_utilization["augment"] <= 0.002 / 0.040 + 1e-9
    assert result.bottleneck == "compute"
    assert "time per batch of each stage" in result.report() and "augment 2.0 ms" in result.report()
