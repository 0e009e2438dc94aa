"""The stage clock's spans measure each stage's own work: a slow training step shows as the loop's time, not as
the graph's "augment" busy time (which the profiler divides into per-batch stage times)."""

from __future__ import annotations

import time
from pathlib import Path

from stallfree import Loader, StageClock
from stallfree.transforms import CenterCrop


def test_a_slow_step_is_not_counted_as_the_graphs_busy_time(image_folder: Path) -> None:
    clock = StageClock()
    loader = Loader(image_folder, batch_size=4, transform=[CenterCrop(8)], num_threads=1, prefetch=1, clock=clock)
    step_s, steps = 0.15, 0
    for _ in loader:
        time.sleep(step_s)  # the training step: the graph's output queue fills while it runs
        steps += 1
    augment = [span.duration for span in clock.spans("augment")]
    assert len(augment) == steps
    # The graph of 4 tiny crops takes milliseconds; before, each busy span ran on through the wait for room on
    # the output queue and came out near the step's time.
    assert sum(augment) < 0.3 * steps * step_s
