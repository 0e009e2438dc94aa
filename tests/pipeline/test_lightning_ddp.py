"""Lightning DDP on CPU with 2 processes and the Loaders built at the top of the script (issue 44, items 2-3).

Regressions: rank 1 (which Lightning starts with ``WORLD_SIZE`` set but not ``RANK``) failed to build its Loader
("environment variable WORLD_SIZE is set but RANK is not") while rank 0 had built an unsharded one; and a resume
from a mid-epoch checkpoint, which holds rank 0's Loader state, failed on rank 1 ("Loader state has rank=0 but this
Loader has rank=1"). The job is ``lightning_ddp_job.py``: tiny data, one epoch, three fits in one launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stallfree.pipeline.sampler import Sampler

pytestmark = pytest.mark.slow  # a 2-process Lightning DDP job

JOB = Path(__file__).with_name("lightning_ddp_job.py")
N = 24  # 12 samples a rank: 3 batches of 4
LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT")


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job's output folder, once it has run."""
    root = tmp_path_factory.mktemp("ddp")
    lines = ["path,label"]
    for i in range(N):
        pixels = np.random.default_rng(i).integers(0, 256, (10, 12, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i:02d}.png")
        lines.append(f"{i:02d}.png,{i}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    out = root / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    done = subprocess.run([sys.executable, str(JOB), str(root / "list.csv"), str(out)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out


def steps(out: Path, name: str, rank: int) -> list[tuple[list[int], float]]:
    return [(indices, total) for indices, total in json.loads((out / f"{name}-rank{rank}.json").read_text())]


def test_each_rank_trains_its_own_half_and_every_sample_once_over_the_job(ran: Path) -> None:
    seen = {rank: [i for indices, _ in steps(ran, "whole", rank) for i in indices] for rank in (0, 1)}
    assert sorted(seen[0] + seen[1]) == list(range(N)), "every sample exactly once over the two ranks"
    for rank in (0, 1):  # its share of the one global permutation, as rank= and world_size= give it
        assert seen[rank] == Sampler(N, rank=rank, world_size=2, seed=5).virtual_order(0).tolist()


def test_every_rank_resumes_from_the_mid_epoch_checkpoint_as_its_uninterrupted_run_goes_on(ran: Path) -> None:
    for rank in (0, 1):
        whole, first, second = (steps(ran, name, rank) for name in ("whole", "first", "second"))
        assert len(first) == 1 and len(whole) == 3
        assert first + second == whole, f"rank {rank}: the same samples and pixels, none lost or repeated"
