"""Checkpoints a run cannot write or a command cannot resume (issue 44, item 14): a full disk is named with the file
and the checkpoint kept, and ``--resume`` with another model, split or schedule names what differs before any
process starts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.stage_runtime.train import checkpoint as ckpt
from stallfree.stage_runtime.train.report import format_summary

pytestmark = pytest.mark.slow  # training jobs (a module fixture trains the checkpoint they resume)

SMALL = ["--synthetic", "64", "--model", "mlp", "--image-size", "4", "--batch-size", "8", "--no-progress",
         "--timeout", "60"]


def _in_a_small_tmpfs(folder: Path, size_kb: int, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) with a ``size_kb`` tmpfs mounted at ``folder``, in a mount namespace of its own."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to mount a small tmpfs")
    folder.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=4k tmpfs {folder}"],
                           capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.strip()}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    mount = f"mount -t tmpfs -o size={size_kb}k tmpfs {folder}"
    return subprocess.run(["unshare", "-m", "sh", "-c", f"{mount} && {script}"], capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_full_disk_is_named_and_the_previous_checkpoint_kept(tmp_path: Path) -> None:
    # Before: "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534": no word of a disk
    check = textwrap.dedent("""
        import json, sys, torch
        from stallfree.stage_runtime.train import checkpoint as ckpt
        root = sys.argv[1]
        ckpt.save_rank(root, 1, 0, {"w": torch.zeros(10)})
        ckpt.save_meta(root, 1, {"step": 1})
        try:
            ckpt.save_rank(root, 2, 0, {"w": torch.zeros(100_000)})  # 400 KB on a 64 KB disk
            error = None
        except ckpt.CheckpointWriteError as err:
            error = [err.errno, str(err)]
        print(json.dumps({"error": error, "latest": ckpt.latest(root),
                          "kept": ckpt.load_rank(root, 1, 0)["w"].tolist()}))
    """)
    (tmp_path / "check.py").write_text(check)
    root = tmp_path / "disk"
    done = _in_a_small_tmpfs(root, 64, f"{sys.executable} {tmp_path / 'check.py'} {root}")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["error"] == [28, f"no space left on device writing checkpoint {root}/step-00000002/rank-0.pt (the "
                                f"previous checkpoint {root}/step-00000001 is intact)"]
    assert got["latest"] == 1 and got["kept"] == [0.0] * 10


def test_a_run_that_fills_its_disk_says_so_in_one_line(tmp_path: Path) -> None:
    # mlp 48 -> 256 -> 256 -> 10: ~80k weights; each checkpoint holds them and SGD's momentum, ~650 KB
    params = 48 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    size_kb = int(1.5 * params * 4 * 2 / 1024)  # room for one checkpoint, not two
    root, out = tmp_path / "disk", tmp_path / "run"
    train = [sys.executable, "-m", "stallfree.cli", "train", "--synthetic", "64", "--model", "tests_mlp:model",
             "--image-size", "4", "--batch-size", "8", "--microbatches", "2", "--balance", "2,2",
             "--max-steps", "3", "--checkpoint-every", "1", "--no-progress", "--timeout", "60", "--out", str(out),
             "--checkpoint-dir", str(root)]
    (tmp_path / "tests_mlp.py").write_text(textwrap.dedent("""
        from torch import nn

        def model(num_classes=10, image_size=4):
            return nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(3 * image_size ** 2, 256), nn.ReLU()),
                                 nn.Sequential(nn.Linear(256, 256), nn.ReLU()), nn.Linear(256, num_classes))
    """))
    after = (f"{sys.executable} -c 'from stallfree.stage_runtime.train import checkpoint as c; "
             f"print(c.latest(\"{root}\"), [sorted(c.load_rank(\"{root}\", 1, r)[\"modules\"]) for r in (0, 1)])'")
    done = _in_a_small_tmpfs(root, size_kb, f"cd {tmp_path} && {' '.join(train)}; echo exit=$?; {after}")
    err = done.stderr.strip().splitlines()
    assert "exit=1" in done.stdout, done.stdout + done.stderr
    message = next(line for line in err if line.startswith("stallfree train: error:"))
    assert re.search(rf"CheckpointWriteError: no space left on device writing checkpoint {root}/step-00000002/"
                     rf"rank-\d\.pt \(the previous checkpoint {root}/step-00000001 is intact\); --resume continues "
                     r"from it", message), message
    assert not any("Traceback" in line or "enforce fail" in line for line in err), done.stderr
    assert done.stdout.splitlines()[-1] == "1 [['0'], ['1']]"  # step 1's checkpoint, whole and readable


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of 2 steps of mlp in 2 stages under 1F1B with SGD, its split measured."""
    out = tmp_path_factory.mktemp("saved") / "run"
    assert main(["train", *SMALL, "--max-steps", "2", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(("argv", "saved_with", "command_has"), [
    # Before: "Error(s) in loading state_dict for Sequential" from a stage, or "IndexError: list index out of range"
    (["--model", "small_cnn"], "--model mlp", "--model small_cnn"),
    (["--stages", "3"], "--stages 2", "--stages 3"),
    (["--schedule", "zbv"], "--schedule 1f1b", "--schedule zbv"),
    (["--schedule", "interleaved-1f1b", "--stages", "3", "--microbatches", "3", "--batch-size", "9"],
     "--stages 2, --schedule 1f1b", "--stages 3, --schedule interleaved-1f1b"),
    (["--optimizer", "adamw"], "--optimizer sgd", "--optimizer adamw"),
    (["--dp", "2"], "--dp 1", "--dp 2"),
])
def test_resume_with_another_job_names_what_differs(saved: Path, argv: list[str], saved_with: str, command_has: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(p.name for p in (saved / "checkpoints").iterdir())
    assert main(["train", *SMALL, "--max-steps", "4", "--out", str(saved), "--resume", *argv]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"stallfree train: error: --resume: the checkpoint {saved}/checkpoints/step-00000002 was "
                           f"saved by a job with {saved_with}; this command has {command_has}: resume with the "
                           "checkpoint's settings, or start a new run in another --out (or --checkpoint-dir)")
    assert sorted(p.name for p in (saved / "checkpoints").iterdir()) == before


def test_resume_under_a_schedule_that_places_the_stages_alike_is_accepted(saved: Path, tmp_path: Path) -> None:
    shutil.copytree(saved / "checkpoints", tmp_path / "copy")
    assert main(["train", *SMALL, "--max-steps", "3", "--out", str(tmp_path / "run"), "--resume", "--checkpoint-dir",
                 str(tmp_path / "copy"), "--schedule", "gpipe"]) == 0
    assert ckpt.latest(tmp_path / "copy") == 3


def test_a_checkpoint_of_an_older_stallfree_is_compared_by_what_it_has(saved: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old"
    shutil.copytree(saved / "checkpoints", old)
    meta = json.loads((old / "step-00000002" / "meta.json").read_text())
    del meta["job"]  # what stallfree wrote before the job's settings were saved
    (old / "step-00000002" / "meta.json").write_text(json.dumps(meta))
    assert main(["train", *SMALL, "--max-steps", "4", "--out", str(tmp_path / "run"), "--checkpoint-dir", str(old),
                 "--resume", "--stages", "3"]) == 2
    assert "was saved by a job with processes (--stages x --dp) 2; this command has processes (--stages x --dp) 3" \
        in capsys.readouterr().err


def test_the_checkpoint_and_the_summary_say_the_split_was_measured(saved: Path) -> None:
    # two identical 2bw runs without --balance got different splits, and nothing said the split was measured
    meta = json.loads((saved / "checkpoints" / "step-00000002" / "meta.json").read_text())
    assert meta["job"]["model"] == "mlp" and meta["job"]["stages"] == 2 and meta["job"]["schedule"] == "1f1b"
    summary = json.loads((saved / "summary.json").read_text())
    assert summary["balance_source"] == "measured"
    split = ",".join(map(str, summary["balance"]))
    assert f"split          {split:>10}  layers per stage, measured on this run (timings vary from run to run, and " \
           f"so may the split: --balance {split} repeats it)" in format_summary(summary)
    given = {**summary, "balance_source": "given"}
    assert "split" not in format_summary(given)
