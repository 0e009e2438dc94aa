"""``stallfree.plan`` from Python: the plan ``stallfree plan`` writes, as a typed result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import stallfree
from stallfree.cli import main
from stallfree.stage_runtime.plan.calibration import Calibration
from stallfree.stage_runtime.plan.costs import HostOverhead, Link
from stallfree.stage_runtime.plan.handoff import train_settings


def _costs(tmp_path: Path) -> Path:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"microbatch": 1, "optimizer_s": 1e-3, "layers": [
        {"forward_s": 1e-4, "backward_s": 2e-4, "param_bytes": 2**20, "activation_bytes": 2**16}] * 6}))
    return path


def _calibration(tmp_path: Path) -> Path:
    calibration = Calibration(Link(2e9, 3e-4), {"loop": HostOverhead(1e-4, 1e-4, 1e-3, send_s=2e-4),
                                                "runtime": HostOverhead(2e-4, 1e-4, 5e-3, send_s=3e-4)}, 2, 1e-5)
    path = tmp_path / "bench-plan.json"
    path.write_text(json.dumps({"calibration": {"2": calibration.to_dict()}}))
    return path


def test_the_library_plan_is_the_commands_plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    costs, calibration = _costs(tmp_path), _calibration(tmp_path)
    assert main(["plan", "--costs", str(costs), "--devices", "3", "--batch-size", "8", "--cores", "2",
                 "--memory-per-device", "64MiB", "--calibration", str(calibration), "--microbatches", "2,4,8",
                 "--out", str(tmp_path / "cli")]) == 0
    capsys.readouterr()
    written = json.loads((tmp_path / "cli" / "plan.json").read_text())
    result = stallfree.plan(costs=costs, devices=3, batch_size=8, cores=2, memory_per_device="64MiB",
                            calibration=calibration, microbatches=(2, 4, 8))
    assert json.loads(json.dumps(result.to_dict())) == written
    assert result.best.to_dict() == written["best"] and result.train_command == written["train_command"]
    assert result.calibration is not None and result.calibration["used"] == {2: 2, 3: 2}  # S=3 took the nearest
    assert result.memory_limit == 64 * 2**20 and result.network.link == Link(2e9, 3e-4)
    assert [a.name for a in result.asynchronous] == ["pipedream-2bw", "async-1f1b"]
    path, png = result.write(tmp_path / "py")
    assert json.loads(path.read_text()) == written and png.is_file()
    assert train_settings(path)["schedule"] == result.best.schedule  # stallfree train --plan reads it


def test_typed_values_plan_as_their_strings_do(tmp_path: Path) -> None:
    costs = _costs(tmp_path)
    link = Link(25e9, 5 * 1e-6)  # as the parser multiplies
    typed = stallfree.plan(costs=costs, devices=4, batch_size=8, link=link, cross_link=Link(1e9, 20 * 1e-3),
                           memory_per_device=2**26, asynchronous=False)
    text = stallfree.plan(costs=costs, devices=4, batch_size=8, link="25GB/s,5us", cross_link="1GB/s,20ms",
                          memory_per_device="64MiB", asynchronous=False)
    assert typed.to_dict() == text.to_dict() and typed.network.sites == 2 and typed.asynchronous == ()


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"devices": 1}, ValueError, "--devices must be >= 2"),
    ({"schedules": ["pipedream"]}, ValueError, "--schedules: unknown pipedream"),
    ({"calibration": "nowhere.json"}, FileNotFoundError, "--calibration nowhere.json: no such file"),
    # issue 46: a token model's stage 0 takes packed rows, which the planner's measurement does not make
    ({"model": "gpt_tiny"}, ValueError, "--model gpt_tiny is a token model; stallfree plan measures image models"),
])
def test_bad_arguments_are_refused_before_any_work(tmp_path: Path, kwargs: dict[str, object], error: type,
                                                   message: str) -> None:
    with pytest.raises(error, match=message):
        stallfree.plan(costs=_costs(tmp_path), **kwargs)  # type: ignore[arg-type]
