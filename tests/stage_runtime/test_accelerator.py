"""The simulated accelerator: its device model, the stand-in compute, and a stage that waits without a core."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import ScheduleGPipe

import stallfree
from stallfree.core.accelerator import SimAccelerator, hold, parse_accelerator
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.stage import SimulatedCompute, TimedStage
from stallfree.stage_runtime.stage_times import StageTimes, stage_times


@pytest.mark.parametrize(("text", "rate"), [("sim:500", 500.0), ("sim:2.5e3", 2500.0)])
def test_sim_r_is_r_images_per_second(text: str, rate: float) -> None:
    device = parse_accelerator(text)
    assert device == SimAccelerator(rate) and str(device) == f"sim:{rate:g}"


@pytest.mark.parametrize("text", [None, "none"])
def test_no_accelerator_is_the_real_device(text: str | None) -> None:
    assert parse_accelerator(text) is None


@pytest.mark.parametrize("text", ["sim", "sim:", "sim:fast", "gpu:100", "500"])
def test_a_malformed_accelerator_names_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"--accelerator must be sim:IMAGES_PER_S .* got"):
        parse_accelerator(text)


@pytest.mark.parametrize("text", ["sim:0", "sim:-3"])
def test_a_speed_must_be_positive(text: str) -> None:
    with pytest.raises(ValueError, match="accelerator speed must be > 0"):
        parse_accelerator(text)


def test_the_slowest_stage_takes_a_micro_batch_over_r_split_in_thirds() -> None:
    times = stage_times(SimAccelerator(400), 8, [0.002, 0.004, 0.001])
    slowest = 8 / 400
    assert times[1] == StageTimes(slowest / 3, slowest / 3, slowest / 3)
    assert times[0].forward_s + times[0].backward_s == pytest.approx(slowest / 2)
    assert times[2].backward_input_s == pytest.approx(slowest / 4 / 3)
    with pytest.raises(ValueError, match="micro_batch"):
        stage_times(SimAccelerator(400), 0, [1.0])


def test_train_config_checks_accelerator_and_feed() -> None:
    assert TrainConfig.from_flags(accelerator="sim:100").simulation.accelerator == SimAccelerator(100)
    with pytest.raises(ValueError, match="--accelerator must be"):
        TrainConfig.from_flags(accelerator="tpu")
    with pytest.raises(ValueError, match="feed must be 'stallfree' or 'torch'"):
        TrainConfig.from_flags(feed="ffcv")


@pytest.mark.parametrize("text", ["sim:fast", "sim:", "tpu:9"])
def test_an_invalid_sim_string_fails_where_it_enters_train_config(text: str) -> None:
    with pytest.raises(ValueError, match=r"--accelerator must be sim:IMAGES_PER_S \(e\.g\. sim:1000\) or none, got"):
        TrainConfig.from_flags(accelerator=text)


def test_train_config_holds_the_typed_value_and_writes_the_string() -> None:
    config = TrainConfig.from_flags(accelerator="sim:2.5e3")
    assert config.simulation.accelerator == SimAccelerator(2500.0)
    assert TrainConfig.from_flags(accelerator=SimAccelerator(2500.0)) == config
    assert TrainConfig.from_flags(accelerator="none").simulation.accelerator is None
    assert TrainConfig().simulation.accelerator is None
    form = json.loads(json.dumps(config.to_json()))  # what summary.json holds under "config"
    assert form["accelerator"] == "sim:2500" and TrainConfig.from_flags(**form) == config


def test_below_the_entry_the_code_takes_the_typed_value() -> None:
    from stallfree.stage_runtime.plan.predict import job_cores
    from stallfree.stage_runtime.profile.phases import simulated_step

    assert job_cores(TrainConfig.from_flags(accelerator="sim:100")) is None  # a simulated device's waits hold no core
    step = simulated_step(SimAccelerator(1000))
    wall = time.perf_counter()
    step((None, [0] * 30))  # 30 images: 30 ms
    assert time.perf_counter() - wall >= 0.03


def test_only_the_entry_points_parse_the_accelerator_string() -> None:
    """Regression: ``sim:R`` was parsed five times (config, rank, trainer, plan/predict, profile/dataset)."""
    package = Path(stallfree.__file__).parent
    callers = set()
    for folder, _, files in os.walk(package, followlinks=True):  # stallfree/<sub> link the top-level folders
        for name in files:
            path = Path(folder) / name
            if name.endswith(".py") and re.search(r"(?<!def )parse_accelerator\(", path.read_text()):
                callers.add(path.relative_to(package).as_posix())
    assert callers == {"stage_runtime/config/parts.py", "stage_runtime/profile/dataset.py"}


@pytest.mark.parametrize("module", ["stage_runtime/stage.py", "stage_runtime/profile/phases.py",
                                    "bench/e2e.py", "bench/remote.py"])
def test_every_simulated_device_is_the_one(module: str) -> None:
    """Regression: four devices slept on their own (a stage, the profiler's step, bench e2e's and remote's consumer)."""
    text = (Path(stallfree.__file__).parent / module).read_text()
    assert "stallfree.core.accelerator import" in text and "time.sleep(" not in text


def test_the_device_waits_its_time_without_holding_the_cpu() -> None:
    device = SimAccelerator(1000)
    assert device.seconds(50) == pytest.approx(0.05)
    cpu, wall = time.thread_time(), time.perf_counter()
    device.step(50)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    assert wall >= 0.05 and cpu / wall < 0.10, f"the device used {cpu / wall:.0%} of a core"
    wall = time.perf_counter()
    hold(0.05, since=wall - 1.0)  # a stand-in that already took longer than the device: no wait
    assert time.perf_counter() - wall < 0.05


def _real() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 16 * 16, 10))


def test_stand_in_has_the_real_shape_keys_and_gradients() -> None:
    real = _real()
    x = torch.randn(4, 3, 16, 16, requires_grad=True)
    sim = SimulatedCompute(real, real(x).shape[1:])
    assert sim.state_dict().keys() == real.state_dict().keys()
    out = sim(x)
    assert out.shape == (4, 10) and out.dtype == torch.float32
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    sim.zero_grads()
    for p in sim.parameters():
        assert p.grad is not None and p.grad.shape == p.shape and not p.grad.any()
        p.grad.add_(1.0)  # an optimizer that scribbles on a gradient
    sim.zero_grads()
    assert not any(p.grad.any() for p in sim.parameters() if p.grad is not None)


def test_a_simulated_stage_waits_without_holding_the_cpu(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        real, micro = _real(), 4
        times = stage_times(SimAccelerator(100), micro, [1.0])[0]  # 40 ms a micro-batch
        sim = SimulatedCompute(real, (10,))
        stage = TimedStage(sim, 0, 1, torch.device("cpu"), input_args=torch.empty(micro, 3, 16, 16),
                           output_args=torch.empty(micro, 10, requires_grad=True), sim=times)
        schedule = ScheduleGPipe(stage, 4, loss_fn=nn.functional.cross_entropy)
        x, y = torch.randn(4 * micro, 3, 16, 16), torch.randint(0, 10, (4 * micro,))
        schedule.step(x, target=y)  # warm-up: first-call costs are not the stage's
        stage.take_busy()
        cpu, wall = time.thread_time(), time.perf_counter()
        for _ in range(3):
            schedule.step(x, target=y)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        busy = stage.take_busy()
    finally:
        dist.destroy_process_group()
    assert busy >= 3 * 4 * (times.forward_s + times.backward_s) * 0.99  # every chunk lasted the device's time
    # A stage that spun while it "computed" would use the whole core; one that sleeps uses what the schedule's own
    # Python costs, which on a loaded 2-core machine reached 10% (CI, 2026-12-05): a quarter keeps them apart.
    assert cpu / wall < 0.25, f"the simulated stage used {cpu / wall:.0%} of a core"


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--synthetic", "64", "--accelerator", "tpu:9"], "--accelerator must be sim:IMAGES_PER_S"),
    (["train", "--synthetic", "64", "--accelerator", "sim:0"], "accelerator speed must be > 0"),
    (["profile", "missing-folder", "--accelerator", "sim"], "--accelerator must be sim:IMAGES_PER_S"),
])
def test_the_cli_refuses_a_bad_accelerator_in_one_line(argv: list[str], message: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.cli import main

    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_train_offers_feed_loader_threads_and_accelerator(capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "--feed {stallfree,torch}" in text and "--loader-threads" in text and "--accelerator sim:R" in text


def test_a_token_stage_charges_each_micro_batch_its_own_documents_cost(tmp_path: Path) -> None:
    # Issue 48: a token micro-batch of documents l_i and p padding slots takes (sum l_i + sum l_i^2 / A + p) / R on
    # the slowest stage. Two micro-batches of 2 rows of 32: one of 2-token documents (padding after them), one of
    # whole-row documents.
    from stallfree.stage_runtime.models.tasks import LanguageModeling

    s, task = 32, LanguageModeling(32, 16)  # A = 32: attention over a whole row as costly as its linear part
    documents = torch.full((4, s), -1)
    documents[:2, :2] = torch.tensor([[0], [1]])
    documents[2:] = torch.tensor([[2], [3]])
    positions = torch.arange(s).expand(4, s)
    x = torch.stack([torch.ones(4, s, dtype=torch.int64), positions, documents], dim=1)
    light, heavy = 2 * (2 + 4 / 32 + 30), 2 * (32 + 32 * 32 / 32)  # 64.25 and 128 tokens of work
    device = SimAccelerator(1000)  # tokens of linear work a second: the heavy micro-batch takes 128 ms
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        times = replace(stage_times(device, 2, [1.0])[0], work=2)  # for a micro-batch of 2: each chunk rescales
        sim = SimulatedCompute(nn.Linear(4, 4), (s, 4), work=task.work)
        stage = TimedStage(sim, 0, 1, torch.device("cpu"), input_args=torch.empty(2, 3, s, dtype=torch.int64),
                           output_args=torch.empty(2, s, 4, requires_grad=True), sim=times)
        schedule = ScheduleGPipe(stage, 2, loss_fn=lambda out, target: out.sum() * 0)
        schedule.step(x, target=torch.zeros(4))
        busy = stage.take_busy()
    finally:
        dist.destroy_process_group()
    assert stage._works == pytest.approx({0: light, 1: heavy})  # each chunk's own micro-batch, read at its forward
    assert busy >= (light + heavy) / 1000 * 0.99  # forward and backward: the device's whole time of both
