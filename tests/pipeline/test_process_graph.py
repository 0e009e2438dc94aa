"""The graph and its reader in a process of their own (issue 49): the same batches, skips, states and clock spans as
in the training process, and none of the Loader's threads left in the training process to take its GIL.

Each comparison runs the same Loader twice, once with its graph in a graph process (the default on Linux for CPU
batches) and once in the training process (``STALLFREE_GRAPH_PROCESS=0``).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import BadSampleError, Loader
from stallfree.pipeline.local_graph import LocalGraph
from stallfree.pipeline.process_graph import ProcessGraph
from stallfree.stage_runtime.clock import StageClock
from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the graph process needs Linux (memfd)")

SPEC = [RandomResizedCrop(16), RandomHorizontalFlip(), Normalize((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))]


def make(source: Any, monkeypatch: pytest.MonkeyPatch, own_process: bool, **kwargs: Any) -> Loader:
    monkeypatch.setenv("STALLFREE_GRAPH_PROCESS", "1" if own_process else "0")
    options = {"transform": SPEC, "shuffle": True, "seed": 7, "num_threads": 1, **kwargs}
    loader = Loader(source, 5, **options)
    placement = loader._epochs.placement
    assert isinstance(placement, ProcessGraph if own_process else LocalGraph)
    return loader


def epochs(loader: Loader, count: int) -> list[tuple[torch.Tensor, list[int]]]:
    return [(images.clone(), labels.tolist()) for _ in range(count) for images, labels in loader]


def same(a: list[tuple[torch.Tensor, list[int]]], b: list[tuple[torch.Tensor, list[int]]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and u == v for (x, u), (y, v) in zip(a, b, strict=True))


@pytest.mark.parametrize("dtype, layout", [("float32", "NCHW"), ("bfloat16", "channels_last"), ("uint8", "NHWC")])
def test_the_batches_are_those_the_training_process_makes(image_folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                          dtype: str, layout: str) -> None:
    spec = SPEC if dtype != "uint8" else SPEC[:2]
    there = epochs(make(image_folder, monkeypatch, True, transform=spec, dtype=dtype, layout=layout), 2)
    here = epochs(make(image_folder, monkeypatch, False, transform=spec, dtype=dtype, layout=layout), 2)
    assert same(there, here)
    first = make(image_folder, monkeypatch, True, transform=spec, dtype=dtype, layout=layout)
    images, _ = next(iter(first))
    reference, _ = next(iter(make(image_folder, monkeypatch, False, transform=spec, dtype=dtype, layout=layout)))
    assert images.dtype == reference.dtype and images.shape == reference.shape
    assert images.stride() == reference.stride()  # channels_last stays channels_last


def test_batches_kept_by_the_loop_are_never_written_over(image_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = list(make(image_folder, monkeypatch, True))  # every batch held: a slot is reused only once freed
    reference = list(make(image_folder, monkeypatch, False))
    assert len(kept) == len(reference) == 5
    for (images, labels), (want, want_labels) in zip(kept, reference, strict=True):
        assert torch.equal(images, want) and torch.equal(labels, want_labels)


def test_a_dropped_batch_frees_its_slot_for_the_next(image_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = make(image_folder, monkeypatch, True, prefetch=1)
    for _ in range(3):
        for images, _ in loader:
            del images
    worker = loader._epochs.placement._worker
    assert worker is not None
    # 15 batches went by; at most the window, the batch in hand and the one being written were ever apart.
    assert len(worker.mapped._maps) <= 4


def test_a_resumed_loader_goes_on_with_the_same_batches(image_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = epochs(make(image_folder, monkeypatch, False), 2)
    loader = make(image_folder, monkeypatch, True)
    first = iter(loader)
    taken = [next(first) for _ in range(2)]
    state = loader.state_dict()
    del first, taken
    resumed = make(image_folder, monkeypatch, True)
    resumed.load_state_dict(state)
    rest = [(images.clone(), labels.tolist()) for images, labels in resumed] + epochs(resumed, 1)
    assert same(rest, whole[2:])


def broken_listing(root: Path, count: int, bad: set[int]) -> Path:
    rng = np.random.default_rng(0)
    lines = ["path,label"]
    for i in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(buffer, "JPEG")
        data = buffer.getvalue()
        (root / f"{i:03d}.jpg").write_bytes(data[: len(data) // 3] if i in bad else data)
        lines.append(f"{i:03d}.jpg,{i}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return root / "list.csv"


def test_skips_are_listed_and_filled_as_in_the_training_process(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    source = broken_listing(tmp_path, 23, {2, 9, 17})
    there = make(source, monkeypatch, True, on_error="skip", transform=[CenterCrop(8)])
    here = make(source, monkeypatch, False, on_error="skip", transform=[CenterCrop(8)])
    assert same(epochs(there, 1), epochs(here, 1))
    assert there.skipped == here.skipped and {s["index"] for s in there.skipped} == {2, 9, 17}
    assert there.state_dict() == here.state_dict()


def test_a_bad_sample_raises_in_the_loop_naming_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = broken_listing(tmp_path, 12, {4})
    loader = make(source, monkeypatch, True, shuffle=False, transform=[CenterCrop(8)])
    with pytest.raises(BadSampleError, match="004.jpg") as raised:
        list(loader)
    assert raised.value.index == 4


def test_the_stages_report_to_the_clock_from_the_graph_process(image_folder: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    clock = StageClock()
    loader = make(image_folder, monkeypatch, True)
    for _ in loader.iterate(clock):
        time.sleep(0.01)
    spans = clock.spans()
    stages = {(span.stage, span.state) for span in spans}
    assert {("read", "busy"), ("augment", "busy"), ("input", "waiting")} <= stages
    now = time.perf_counter()
    assert all(now - 60 < span.start <= span.end <= now for span in spans)  # the same clock in both processes
    assert {span.batch for span in spans if span.stage == "augment"} == set(range(5))


def test_no_thread_of_the_loader_runs_in_the_training_process(image_folder: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    before = threading.active_count()
    tasks = len(os.listdir("/proc/self/task"))
    loader = make(image_folder, monkeypatch, True, num_threads=2, io_threads=3)
    passing = iter(loader)
    next(passing)
    time.sleep(0.2)
    assert threading.active_count() == before
    assert len(os.listdir("/proc/self/task")) == tasks  # no DALI worker here either
    pid = loader._epochs.placement._worker.pid
    assert len(os.listdir(f"/proc/{pid}/task")) >= 5  # the run's stages, its reads and DALI's workers are there
    loader.close()


def test_a_killed_graph_process_is_said_and_the_next_pass_goes_on(image_folder: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    whole = epochs(make(image_folder, monkeypatch, False), 1)
    loader = make(image_folder, monkeypatch, True, prefetch=1)
    passing = iter(loader)
    got = [next(passing)]
    state = loader.state_dict()
    pid = loader._epochs.placement._worker.pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"graph process {pid} ended unexpectedly"):
        for batch in passing:
            got.append(batch)
    loader.load_state_dict(state)  # as after any failed pass: from the last state taken, here after one batch
    rest = [(images.clone(), labels.tolist()) for images, labels in loader]
    assert same([(got[0][0], got[0][1].tolist())] + rest, whole)
    assert loader._epochs.placement._worker.pid != pid  # a new graph process


SCRIPT = """
import sys, time
from stallfree import Loader
from stallfree.transforms import CenterCrop
loader = Loader(sys.argv[1], 4, transform=[CenterCrop(16)], shuffle=True)
for i, (images, labels) in enumerate(loader):
    if i == 1:
        break
print(loader._epochs.placement._worker.pid, flush=True)
"""


def test_a_script_that_ends_without_close_leaves_no_graph_process(image_folder: Path, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(image_folder)], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if k != "STALLFREE_GRAPH_PROCESS"})
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


MAIN_READER = """
import io, sys, warnings
import numpy as np
from PIL import Image
from stallfree import BaseReader, Loader
from stallfree.transforms import CenterCrop

class Stripes(BaseReader):
    def __init__(self):
        super().__init__()
        self.classes = [str(i) for i in range(6)]
    def __len__(self): return 6
    def labels(self): return np.arange(6)
    def read(self, index):
        out = io.BytesIO()
        Image.fromarray(np.full((12, 10, 3), index * 20, np.uint8)).save(out, "PNG")
        return np.frombuffer(out.getvalue(), np.uint8)
    def describe(self, index): return f"stripe {index}"

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    loader = Loader(Stripes(), 3, transform=[CenterCrop(8)], dtype="uint8")
    print([images.sum().item() for images, _ in loader])
print([str(w.message) for w in caught])
"""


def test_a_source_defined_in_the_script_keeps_the_graph_here_and_says_so(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(MAIN_READER)
    env = {k: v for k, v in os.environ.items() if k != "STALLFREE_GRAPH_PROCESS"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    sums, caught = done.stdout.strip().splitlines()
    assert sums == str([(0 + 20 + 40) * 8 * 8 * 3, (60 + 80 + 100) * 8 * 8 * 3])
    assert "graph runs in the training process" in caught and "Stripes" in caught


def test_the_graph_process_starts_the_next_epoch_while_the_loop_takes_this_ones_last(
        image_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = StageClock()
    loader = make(image_folder, monkeypatch, True, clock=clock, prefetch=1)
    for _ in loader:
        time.sleep(0.05)  # a slow step: the graph process is ahead of the loop
    last_taken = time.perf_counter()
    time.sleep(0.3)
    second = epochs(loader, 1)
    reads = sorted(span.start for span in clock.spans("read") if span.batch == 0)
    assert len(reads) == 2 and reads[1] < last_taken, "epoch 1's first read began before epoch 0's end"
    assert same(second, epochs(make(image_folder, monkeypatch, False, clock=None), 2)[5:])
