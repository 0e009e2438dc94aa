"""The trainer end to end on CPU/gloo: every schedule equals single-process gradient accumulation, resume equals
the uninterrupted run, and a killed stage ends the job cleanly with its last checkpoint intact.

All jobs share one pair of spawned processes (``train_many``): starting a process and importing torch costs
seconds each, the whole area has 120 s.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psutil
import pytest
import torch

from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.jobs import account, train_many
from stallfree.stage_runtime.models.zoo import build_model
from stallfree.stage_runtime.train import checkpoint as ckpt
from stallfree.stage_runtime.train.feed import TensorBatches
from stallfree.stage_runtime.train.launcher import StageFailure
from stallfree.stage_runtime.train.trainer import Fault, run_jobs

pytestmark = pytest.mark.slow  # every test reads one module fixture that trains in spawned processes

STEPS = 4
MODEL = {"model": "mlp", "model_kwargs": {"hidden": 16, "depth": 6}, "image_size": 4}  # 8 layers
SCHEDULES = [("gpipe", 2, (4, 4)), ("gpipe", 1, (4, 4)), ("gpipe", 4, (1, 7)),  # m4: stage 0 is a Flatten alone
             ("1f1b", 2, (3, 5)), ("interleaved-1f1b", 2, (2, 2, 2, 2)),
             ("zero-bubble", 2, (2, 2, 2, 2)), ("zbv", 2, (2, 2, 2, 2))]


def _config(out: Path, name: str, schedule: str, m: int, balance: tuple[int, ...], **kw: object) -> TrainConfig:
    base = dict(samples=64, batch_size=8, microbatches=m, schedule=schedule, balance=balance, max_steps=STEPS,
                lr=0.1, momentum=0.9, progress=False, timeout_s=60, out_dir=str(out / name), **MODEL)
    base.update(kw)
    return TrainConfig.from_flags(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("train")
    configs = {f"{s}-m{m}": _config(out, f"{s}-m{m}", s, m, b) for s, m, b in SCHEDULES}
    configs["half"] = _config(out, "half", "1f1b", 2, (3, 5), max_steps=STEPS // 2)
    configs["resumed"] = _config(out, "resumed", "1f1b", 2, (3, 5), resume=True,
                                 checkpoint_dir=str(out / "half" / "checkpoints"))
    # Extending a run (issue 44, item 4): 4 steps per epoch; 6 steps stop mid-epoch 1, then --resume runs to 10.
    resume = {"resume": True, "checkpoint_dir": str(out / "ext-6" / "checkpoints")}
    for name, steps, more in (("ext-6", 6, {}), ("ext-10", 10, {}), ("ext-resumed", 10, resume)):
        configs[name] = _config(out, name, "1f1b", 2, (3, 5), samples=32, epochs=3, max_steps=steps, **more)
    for schedule, balance in (("1f1b", (3, 5)), ("zero-bubble", (2, 2, 2, 2))):
        configs[f"sim-{schedule}"] = _config(out, f"sim-{schedule}", schedule, 2, balance, accelerator="sim:400")
    # Rank 1 dies after step 4, when rank 0 has logged step 3 past the checkpoint of step 2.
    configs["crash"] = _config(out, "crash", "1f1b", 2, (3, 5), max_steps=6, checkpoint_every=2)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(StageFailure) as failure:
        run_jobs(list(configs.values()), account=account, faults={len(configs) - 1: Fault(rank=1, step=4)})
    # multiprocessing's resource tracker and fork server are the parent's helpers, started once and kept: not stages.
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE
            and not any(helper in " ".join(p.cmdline()) for helper in ("resource_tracker", "forkserver"))]
    return {"configs": configs, "failure": failure.value, "orphans": left, "out": out}


def _weights(config: TrainConfig) -> dict[str, torch.Tensor]:
    """The full model's state dict, rebuilt from the final checkpoint's per-rank files."""
    summary = json.loads((Path(config.report.out_dir) / "summary.json").read_text())
    step, bounds = summary["steps"], [0]
    for b in summary["balance"]:
        bounds.append(bounds[-1] + b)
    state = {}
    for rank in range(config.pipeline.world_size):
        for stage, sd in ckpt.load_rank(config.ckpt_root, step, rank)["modules"].items():
            for key, value in sd.items():
                local, rest = key.split(".", 1)
                state[f"{bounds[int(stage)] + int(local)}.{rest}"] = value
    return state


def _reference(config: TrainConfig, steps: int) -> dict[str, torch.Tensor]:
    """Single-process training with the same micro-batch gradient accumulation."""
    torch.manual_seed(config.seed)
    model = build_model(config.model.name, 10, config.model.image_size, **config.model.kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=config.optimizer.lr, momentum=config.optimizer.momentum)
    m = config.pipeline.microbatches
    feed = TensorBatches(config.feed.samples, config.pipeline.batch_size, config.model.image_size, 10, seed=config.seed)
    for _, (x, y) in zip(range(steps), feed, strict=False):
        for xm, ym in zip(x.tensor_split(m), y.tensor_split(m), strict=True):
            (torch.nn.functional.cross_entropy(model(xm), ym) / m).backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()


@pytest.mark.parametrize("name", [f"{s}-m{m}" for s, m, _ in SCHEDULES])
def test_schedule_equals_single_process_accumulation(runs: dict, name: str) -> None:
    config = runs["configs"][name]
    got, want = _weights(config), _reference(config, STEPS)
    assert got.keys() == want.keys()
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert worst <= 1e-5, f"{name}: max abs difference {worst}"


def test_resume_equals_uninterrupted_run(runs: dict) -> None:
    resumed, full = runs["configs"]["resumed"], runs["configs"]["1f1b-m2"]
    got = _weights(resumed)
    want = _weights(full)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) == 0.0
    rows = [json.loads(line) for line in (Path(resumed.report.out_dir) / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [3, 4]


def test_extending_a_run_that_stopped_mid_epoch_equals_the_longer_run(runs: dict) -> None:
    # Before: the final checkpoint of a run stopped by --max-steps mid-epoch was labelled with the next epoch, so the
    # resumed run skipped the rest of epoch 1 and logged step 7 as epoch 2, with other losses.
    short, resumed, full = (runs["configs"][k] for k in ("ext-6", "ext-resumed", "ext-10"))
    assert ckpt.load_meta(short.ckpt_root, 6)["epoch"] == 1
    feed = json.loads(ckpt.load_rank(short.ckpt_root, 6, 0)["feed"])
    assert (feed["epoch"], feed["batches"]) == (1, 2)  # the feed's place in epoch 1: 2 of its 4 batches delivered
    rows = {name: [json.loads(line) for line in (Path(c.report.out_dir) / "train.jsonl").read_text().splitlines()]
            for name, c in (("resumed", resumed), ("full", full))}
    steps = {name: [(r["step"], r["epoch"], r["loss"]) for r in got if "loss" in r] for name, got in rows.items()}
    assert [s[:2] for s in steps["full"][5:]] == [(6, 1), (7, 1), (8, 1), (9, 2), (10, 2)]
    assert steps["resumed"] == steps["full"][6:]  # steps 7 to 10, their epochs and losses
    got, want = _weights(resumed), _weights(full)
    assert max(float((got[k] - want[k]).abs().max()) for k in want) == 0.0


def test_summary_reports_fractions_beside_theory(runs: dict) -> None:
    summary = json.loads((Path(runs["configs"]["gpipe-m2"].report.out_dir) / "summary.json").read_text())
    assert summary["bubble_theory"] == pytest.approx(1 / 3)
    assert 0.0 <= summary["bubble_fraction"] <= 1.0 and 0.0 <= summary["input_stall_fraction"] <= 1.0
    assert summary["steps"] == STEPS and summary["eval_top1"] is not None
    assert Path(summary["trace"]).is_file()


@pytest.mark.parametrize("schedule", ["1f1b", "zero-bubble"])
def test_a_simulated_accelerator_trains_the_real_parameters_at_its_speed(runs: dict, schedule: str) -> None:
    config = runs["configs"][f"sim-{schedule}"]
    summary = json.loads((Path(config.report.out_dir) / "summary.json").read_text())
    assert summary["accelerator"] == "sim:400" and summary["accelerator_images_per_s"] == 400
    assert summary["steps"] == STEPS
    # no device can beat itself: each step waits at least M x (slowest stage's micro-batch time)
    assert summary["images_per_s"] <= 400 * 1.02
    # the checkpoint holds the real model's parameters, under the real keys
    assert _weights(config).keys() == _weights(runs["configs"]["1f1b-m2"]).keys()


def test_resume_after_a_crash_logs_each_step_once(runs: dict) -> None:
    crashed = runs["configs"]["crash"]
    rows = (Path(crashed.report.out_dir) / "train.jsonl").read_text().splitlines()
    logged = [json.loads(line)["step"] for line in rows]
    assert logged[-1] > ckpt.latest(crashed.ckpt_root)  # the crash left rows past the checkpoint
    resumed = crashed.with_flags(resume=True, checkpoint_dir=str(runs["out"] / "again"))
    shutil.copytree(crashed.ckpt_root, resumed.ckpt_root)
    train_many([resumed])
    rows = [json.loads(line) for line in (Path(resumed.report.out_dir) / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]


def test_killed_stage_ends_job_with_named_error_and_intact_checkpoint(runs: dict) -> None:
    failure, config = runs["failure"], runs["configs"]["crash"]
    assert failure.rank == 1 and failure.stages == (1,)
    assert "pipeline stage 1 (rank 1) failed: killed by SIGKILL" in str(failure)
    assert runs["orphans"] == []
    assert ckpt.latest(config.ckpt_root) == 2
    for rank in range(config.pipeline.world_size):
        assert ckpt.load_rank(config.ckpt_root, 2, rank)["modules"]
    shutil.rmtree(runs["out"], ignore_errors=True)


def test_two_replicas_equal_single_process_over_both_shards(tmp_path: Path) -> None:
    config = _config(tmp_path, "dp", "1f1b", 2, (3, 5), dp=2, max_steps=3)
    train_many([config])
    torch.manual_seed(config.seed)
    model = build_model(config.model.name, 10, config.model.image_size, **config.model.kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=config.optimizer.lr, momentum=config.optimizer.momentum)
    batches = iter(TensorBatches(config.feed.samples, config.pipeline.batch_size, config.model.image_size, 10,
                                 seed=config.seed))
    for _ in range(3):  # replica d takes batch 2k+d; the replicas' gradients are averaged
        for _replica in range(2):
            x, y = next(batches)
            for xm, ym in zip(x.tensor_split(2), y.tensor_split(2), strict=True):
                (torch.nn.functional.cross_entropy(model(xm), ym) / 4).backward()
        opt.step()
        opt.zero_grad()
    got, want = _weights(config), model.state_dict()
    assert max(float((got[k] - want[k]).abs().max()) for k in want) <= 1e-5

