"""``stallfree plan`` end to end: a measured tiny model and a costs file; errors as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stallfree.cli import main


def _costs(tmp_path: Path, layers: int = 6) -> Path:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"microbatch": 1, "optimizer_s": 1e-3, "layers": [
        {"forward_s": 1e-4, "backward_s": 2e-4, "param_bytes": 2**20, "activation_bytes": 2**16}] * layers}))
    return path


def test_plan_measures_a_tiny_model_and_writes_plan_and_timeline(tmp_path, capsys):
    out = tmp_path / "plan"
    code = main(["plan", "--model", "mlp", "--image-size", "8", "--batch-size", "4", "--devices", "2",
                 "--microbatches", "1,2,4", "--threads", "1", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "plan for mlp (6 layers), batch 4, 2 devices" in text
    assert "run the best: stallfree train DATA --model mlp" in text
    plan = json.loads((out / "plan.json").read_text())
    best = plan["best"]
    assert plan["format"] == "stallfree-plan/1" and plan["costs"]["source"] == "measured"
    assert best == plan["candidates"][0] and best["stages"] == 2 and sum(best["balance"]) == 6
    parts = best["bubble"]
    assert parts["warmup_cooldown"] + parts["imbalance"] + parts["communication"] == pytest.approx(parts["total"])
    assert [c["step_s"] for c in plan["candidates"]] == sorted(c["step_s"] for c in plan["candidates"])
    assert {a["schedule"] for a in plan["asynchronous"]} == {"pipedream-2bw", "async-1f1b"}
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_from_a_costs_file_prints_json_alone_on_stdout(tmp_path, capsys):
    code = main(["plan", "--costs", str(_costs(tmp_path)), "--devices", "4", "--batch-size", "8",
                 "--memory-per-device", "64MiB", "--sites", "2", "--cross-link", "1GB/s,20ms",
                 "--out", str(tmp_path / "o"), "--json"])
    captured = capsys.readouterr()
    assert code == 0
    plan = json.loads(captured.out)
    assert plan["costs"] == {"source": str(tmp_path / "costs.json"), "microbatch": 1}
    assert plan["cross_link"] == "1GB/s,20ms" and plan["best"]["cross_site_cuts"] == 0
    assert plan["best"]["fits"] and max(plan["best"]["memory_bytes"]) <= 64 * 2**20
    assert "plan for" in captured.err  # the table went to stderr


def test_ranks_sharing_cores_plan_slower_steps_than_a_device_each(tmp_path, capsys):
    argv = ["plan", "--costs", str(_costs(tmp_path)), "--devices", "4", "--batch-size", "8", "--no-async", "--json"]
    code = main([*argv, "--out", str(tmp_path / "own")])
    own = json.loads(capsys.readouterr().out)
    code += main([*argv, "--cores", "2", "--out", str(tmp_path / "shared")])
    captured = capsys.readouterr()
    shared = json.loads(captured.out)
    assert code == 0 and own["cores"] is None and shared["cores"] == {"count": 2, "threads": 1}
    assert "4 devices sharing 2 cores (1 thread a rank)" in captured.err
    steps = {(c["schedule"], c["stages"], c["virtual_stages"], c["microbatches"], tuple(c["balance"])): c["step_s"]
             for c in own["candidates"]}
    for c in shared["candidates"]:
        alone = steps[(c["schedule"], c["stages"], c["virtual_stages"], c["microbatches"], tuple(c["balance"]))]
        if c["stages"] <= 2:  # two ranks on two cores: no sharing
            assert c["step_s"] == pytest.approx(alone, rel=1e-12)
        else:
            assert c["step_s"] >= alone * (1 - 1e-12)
    assert any(c["step_s"] > steps[(c["schedule"], c["stages"], c["virtual_stages"], c["microbatches"],
                                    tuple(c["balance"]))] * 1.01 for c in shared["candidates"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--link", "fast"], "--link wants BANDWIDTH,LATENCY like 25GB/s,5us"),
    (["--devices", "1"], "--devices must be >= 2"),
    (["--schedules", "gpipe,pipedream"], "--schedules: unknown pipedream; choose from gpipe"),
    (["--devices", "3", "--sites", "2"], "--devices 3 must split evenly into --sites 2"),
    (["--memory-per-device", "lots"], "--memory-per-device wants a size like 16GiB"),
    (["--batch-size", "6", "--microbatches", "4"], "none divides --batch-size 6"),
    (["--cores", "0"], "--cores must be >= 1, got 0"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, message):
    code = main(["plan", "--costs", str(_costs(tmp_path)), "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("stallfree plan: error: ") and message in err and err.count("\n") == 1


def test_missing_costs_file_is_one_line(tmp_path, capsys):
    assert main(["plan", "--costs", str(tmp_path / "nope.json")]) == 2
    assert "--costs" in capsys.readouterr().err


def test_registering_plan_imports_no_torch():
    code = ("import argparse, sys\nfrom stallfree.commands import plan\n"
            "plan.register(argparse.ArgumentParser().add_subparsers())\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_calibration_file_charges_its_host_overhead_and_link(tmp_path, capsys):
    from stallfree.stage_runtime.plan.calibration import Calibration
    from stallfree.stage_runtime.plan.costs import HostOverhead, Link

    runtime = HostOverhead(2e-4, 1e-4, 5e-3, send_s=3e-4, kind_s=(("I", 4e-4), ("W", 4e-4)))
    calibration = Calibration(Link(2e9, 3e-4), {"loop": HostOverhead(1e-4, 1e-4, 1e-3, send_s=2e-4),
                                                "runtime": runtime}, 2, 1e-5)
    path = tmp_path / "bench-plan.json"
    path.write_text(json.dumps({"calibration": {"2": calibration.to_dict()}}))
    args = ["plan", "--costs", str(_costs(tmp_path)), "--devices", "2", "--batch-size", "8", "--json"]
    assert main([*args, "--out", str(tmp_path / "free")]) == 0
    free = json.loads(capsys.readouterr().out)
    assert main([*args, "--out", str(tmp_path / "cal"), "--calibration", str(path)]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    assert plan["link"] == "2GB/s,300us" and plan["calibration"]["used"] == {"2": 2}
    assert "host overhead and link calibrated" in captured.err
    step = {(c["schedule"], c["microbatches"], tuple(c["balance"])): c["step_s"] for c in free["candidates"]}
    # every plan costs more with the runtime's overhead; the step set-up alone adds 1 ms (loop) or 5 ms (runtime)
    for c in plan["candidates"]:
        extra = 5e-3 if c["schedule"] in ("interleaved-1f1b", "zero-bubble", "zbv") else 1e-3
        assert c["step_s"] > step[(c["schedule"], c["microbatches"], tuple(c["balance"]))] + extra


def _write_pilot(folder: Path, schedule: str, m: int, overhead: object) -> None:
    """A finished job's folder as stallfree train writes it, its steps made by the simulator with ``overhead``."""
    import dataclasses

    from stallfree.stage_runtime.config.train_config import TrainConfig
    from stallfree.stage_runtime.models.layer_times import LayerTimes
    from stallfree.stage_runtime.plan.costs import Link, stage_costs
    from stallfree.stage_runtime.plan.orders import placement, torch_order
    from stallfree.stage_runtime.plan.simulate import simulate

    config = TrainConfig.from_flags(model="mlp", image_size=8, stages=2, schedule=schedule, microbatches=m,
                                    batch_size=8, out_dir=str(folder))
    layer = LayerTimes(1e-4, 2e-4, 1e-4, 2**20, 2**16)
    costs = stage_costs([layer] * 6, [3, 3])
    program = torch_order(schedule, 2, m)
    result = simulate(program, placement(schedule, 2, 2), costs, lambda a, b: Link(2e9, 0.0), overhead=overhead)
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "config": config.to_json(), "balance": [3, 3],
        "layer_costs": {"layers": [dataclasses.asdict(layer)] * 6, "optimizer_s": 1e-3}}))
    (folder / "train.jsonl").write_text("".join(
        json.dumps({"step": k, "loss": 1.0, "compute_step_s": result.schedule_s, "bubble": 0.5}) + "\n"
        for k in (1, 2, 3)))
    for rank in (0, 1):
        spans = [[f"stage{s.op.stage}", "busy", k + s.start, k + s.end, k]
                 for k in (1, 2, 3) for s in result.spans if s.rank == rank]
        (folder / f"spans-{rank}.json").write_text(json.dumps({"format": "stallfree-spans/1", "spans": spans}))


def test_pilot_jobs_fit_the_host_overhead_of_their_schedule_and_family(tmp_path, capsys):
    from stallfree.stage_runtime.plan.costs import HostOverhead

    truth = HostOverhead(1e-4, 1e-4, 20e-3, send_s=2e-4, gap_s=5e-5)  # a 20 ms set-up per step
    for m in (2, 8):
        _write_pilot(tmp_path / f"g{m}", "gpipe", m, truth)
    args = ["plan", "--costs", str(_costs(tmp_path)), "--devices", "2", "--batch-size", "8", "--json",
            "--schedules", "gpipe,1f1b,zbv", "--link", "2GB/s,0ns"]  # the pilots' link
    assert main([*args, "--out", str(tmp_path / "free")]) == 0
    free = json.loads(capsys.readouterr().out)
    assert main([*args, "--out", str(tmp_path / "piloted"), "--pilots", str(tmp_path / "g2"),
                 str(tmp_path / "g8")]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    fit = plan["pilots"]["fits"]["2"]
    # (GPipe's equal stages never leave a message waiting for its receiver, so the receive cost is not seen
    # apart: the set-up takes it, 0.1 ms a message on the critical path)
    assert fit["schedules"]["gpipe"]["step_s"] == pytest.approx(20e-3, abs=0.5e-3)
    assert set(fit["families"]) == {"loop"}
    assert "gpipe from its pilots, 1f1b from its family's, zbv without" in captured.err
    step = {(c["schedule"], c["microbatches"], tuple(c["balance"])): c["step_s"] for c in free["candidates"]}
    for c in plan["candidates"]:  # GPipe and 1F1B at S = 2 pay the pilots' set-up; ZBV had no pilot of its family
        before = step[(c["schedule"], c["microbatches"], tuple(c["balance"]))]
        if c["schedule"] == "zbv":
            assert c["step_s"] == pytest.approx(before)
        else:
            assert c["step_s"] > before + 20e-3


def test_pilots_of_another_model_are_refused_in_one_line(tmp_path, capsys):
    from stallfree.stage_runtime.plan.costs import HostOverhead

    _write_pilot(tmp_path / "g2", "gpipe", 2, HostOverhead())
    assert main(["plan", "--model", "small_cnn", "--devices", "2", "--pilots", str(tmp_path / "g2")]) == 2
    assert "--pilots ran mlp, not --model small_cnn" in capsys.readouterr().err
    assert main(["plan", "--model", "mlp", "--devices", "2", "--pilots", str(tmp_path / "nothing")]) != 0
    assert "--pilots" in capsys.readouterr().err
