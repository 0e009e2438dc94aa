"""Two machines, played by two ``torchrun`` invocations over 127.0.0.1, each with its own ``--out`` (no shared
filesystem): the run completes with one summary, the held-out score covers every replica's shard, BatchNorm
statistics agree across replicas, and a dead or stopped peer fails the other node in one line naming it.

Each node is one process of ``--stages 1 --dp 2`` (world size 2); every wait has a timeout, so a hang fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from stallfree.stage_runtime.models.zoo import build_model
from stallfree.stage_runtime.processes import free_port
from stallfree.stage_runtime.train import checkpoint as ckpt
from stallfree.stage_runtime.train.feed import TensorBatches

pytestmark = pytest.mark.slow  # two torchrun nodes

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
# samples // 4 = 40 held-out samples: 5 batches of 8 over 2 replicas, so replica 0 alone would count 24.
JOB = {"model": "small_cnn", "model_kwargs": {"width": 4}, "image_size": 16, "samples": 160, "batch_size": 8,
       "microbatches": 1, "stages": 1, "dp": 2, "max_steps": 3, "lr": 0.05, "progress": False, "timeout_s": 20}
SCRIPT = """
import json, sys
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.jobs import account
from stallfree.stage_runtime.train.trainer import Fault, StageFailure, run_jobs
job, fault = json.loads(sys.argv[1]), json.loads(sys.argv[2])
try:
    run_jobs([TrainConfig.from_flags(**job)], account=account, faults={0: Fault(*fault)} if fault else None)
except StageFailure as err:
    print(f"stallfree train: error: {err}", file=sys.stderr)
    sys.exit(1)
"""


def _nodes(tmp_path: Path, fault: list[int] | None = None, **overrides: object) -> list[subprocess.Popen[str]]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port, procs = free_port(), []
    for node in range(2):
        job = dict(JOB, out_dir=str(tmp_path / f"node{node}"), **overrides)
        cmd = [TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr",
               "127.0.0.1", "--master-port", str(port), str(script), json.dumps(job), json.dumps(fault)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1")))
    return procs


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        pytest.fail(f"node did not finish in {timeout} s")
    return proc.returncode, err


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a node's torchrun and its workers (torchrun may put them in process groups of their own)."""
    try:
        family = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.communicate(timeout=30)


def test_two_nodes_without_a_shared_out_evaluate_every_shard_and_agree_on_batchnorm(tmp_path: Path) -> None:
    procs = _nodes(tmp_path)
    try:
        results = [_finish(p, 120) for p in procs]
    finally:
        for p in procs:
            _kill(p)
    assert [code for code, _ in results] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    summary = json.loads((tmp_path / "node0" / "summary.json").read_text())
    assert Path(summary["trace"]).is_file()
    # Each node's --out holds a checkpoint it can resume from: its rank's file and the manifest.
    states = []
    for node in range(2):
        root = tmp_path / f"node{node}" / "checkpoints"
        assert ckpt.latest(root) == 3
        states.append(ckpt.load_rank(root, 3, node)["modules"]["0"])
    stats = [k for k in states[0] if k.endswith(("running_mean", "running_var"))]
    assert stats and all(torch.equal(states[0][k], states[1][k]) for k in stats)
    # The held-out score is over all 40 samples: recompute it from the checkpoint's model.
    model = build_model(JOB["model"], 10, JOB["image_size"], **JOB["model_kwargs"])
    model.load_state_dict(states[0])
    model.eval()
    held_out = TensorBatches(JOB["samples"] // 4, JOB["batch_size"], JOB["image_size"], 10, shuffle=False, split=1)
    with torch.no_grad():
        right = sum(int((model(x).argmax(1) == y).sum()) for x, y in held_out)
    assert summary["eval_top1"] == right / 40


@pytest.mark.parametrize(("sig", "message"), [
    (signal.SIGKILL, r"pipeline stage 0 \(rank 1\) failed: stopped responding: no heartbeat .*\(rank 0 saw: "),
    (signal.SIGSTOP, r"pipeline stage 0 \(rank 1\) failed: stopped responding: no heartbeat .*\(rank 0 saw: "),
], ids=["SIGKILL", "SIGSTOP"])
def test_a_dead_or_stopped_peer_fails_the_other_node_naming_it(tmp_path: Path, sig: int, message: str) -> None:
    procs = _nodes(tmp_path, fault=[1, 2, int(sig)], timeout_s=8)
    try:
        code, err = _finish(procs[0], 90)  # a SIGSTOPped peer must fail the job within --timeout, not hang it
    finally:
        for p in procs:
            _kill(p)
    assert code != 0
    line = [x for x in err.splitlines() if x.startswith("stallfree train: error:")]
    assert line and __import__("re").search(message, line[0]), err[-3000:]
    assert "Traceback" not in err.split("stallfree train: error:")[0], err[-3000:]
