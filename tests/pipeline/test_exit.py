"""A script that ends without ``loader.close()`` exits 0, with passes open or finished, every time.

The abort it guards against: "terminate called without an active exception", SIGABRT (exit -6) after a training
script printed "done", in 5 of 13 ``torchrun --nproc_per_node 2`` runs. A timer thread held the run started ahead
for the next epoch; cancelled at exit, it dropped the run's last queued batch (a torch tensor) while the interpreter
was shutting down, and a thread that takes the GIL back then is ended by a forced unwind through torch's C++.

Those threads are the in-process graph's (``LocalGraph``: a CUDA Loader's, and any with ``STALLFREE_GRAPH_PROCESS=0``),
so the scripts here run it; a script whose graph runs in a process of its own is tested in test_process_graph.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stallfree import Loader
from stallfree.transforms import RandomResizedCrop

SPEC = [RandomResizedCrop(16, scale=(0.3, 1.0))]

SCRIPT = """
import sys
from stallfree import Loader
from stallfree.transforms import RandomResizedCrop

spec = [RandomResizedCrop(16, scale=(0.3, 1.0))]
finished = Loader(sys.argv[1], batch_size=4, transform=spec, num_threads=1)
for _ in range(2):
    for images, labels in finished:  # each pass's end starts the next epoch's run ahead
        pass
left_open = Loader(sys.argv[1], batch_size=4, transform=spec, num_threads=1)
passing = iter(left_open)
next(passing)
print("done", flush=True)
"""


@pytest.mark.usefixtures("graph_in_this_process")
def test_a_run_started_ahead_adds_no_thread_but_its_own(indexed_list: Path) -> None:
    before = set(threading.enumerate())
    loader = Loader(indexed_list, batch_size=8, transform=SPEC, num_threads=1)
    passing = iter(loader)
    list(passing)
    passing.run.join(10.0)  # the finished pass's threads end as they see it stopped
    ahead = loader._epochs.placement._next._run
    assert ahead is not None
    extra = {t for t in set(threading.enumerate()) - before if not t.name.startswith("stallfree-read")}
    assert extra <= set(ahead._threads), f"threads beside the run's own: {sorted(t.name for t in extra)}"
    loader.close()
    assert not any(thread.is_alive() for thread in ahead._threads)


@pytest.mark.slow
def test_scripts_that_end_without_close_exit_0_every_time(indexed_list: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    failures = []
    env = {**os.environ, "STALLFREE_GRAPH_PROCESS": "0"}  # the in-process graph's threads, where the abort was
    for _ in range(5):  # two at once: the contention of two ranks on one host, where the abort was seen
        runs = [subprocess.Popen([sys.executable, str(script), str(indexed_list)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
        for run in runs:
            out, err = run.communicate(timeout=120)
            if run.returncode != 0 or out.strip() != "done":
                failures.append((run.returncode, err[-600:]))
    assert not failures, f"{len(failures)} of 10 runs failed: {failures[0]}"
