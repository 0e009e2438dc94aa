"""One meaning of ``--json`` in every command: the JSON alone on stdout (parsed here with ``json.loads``), the
human text on stderr; ``--json-file PATH`` writes it. An ingest that keeps nothing fails; ``--no-progress``
hides only the bars."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stallfree.cli import main

# The cheapest training job: one stage process, one step of a tiny MLP.
TINY_TRAIN = ["train", "--synthetic", "64", "--model", "mlp", "--image-size", "4", "--batch-size", "8",
              "--stages", "1", "--max-steps", "1", "--timeout", "60"]


@pytest.fixture(scope="module")
def shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stallfree.ingest.runner import ingest

    out = tmp_path_factory.mktemp("json-shards") / "out"
    ingest(image_folder, out, workers=1)
    return out


def _json_alone(capsys: pytest.CaptureFixture[str]) -> tuple[Any, str]:
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_ingest_json_is_alone_on_stdout_and_json_file_writes_it(image_folder: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(image_folder), str(tmp_path / "out"), "--workers", "1", "--json",
                 "--json-file", str(tmp_path / "s.json")]) == 0
    result, err = _json_alone(capsys)
    assert result["images"] == 24 and "24 images in" in err
    assert json.loads((tmp_path / "s.json").read_text()) == result


def test_ingest_json_file_alone_keeps_the_text_on_stdout(image_folder: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Was `--json PATH`: the path form is now --json-file, and --json is a flag in every command.
    assert main(["ingest", str(image_folder), str(tmp_path / "out"), "--workers", "1",
                 "--json-file", str(tmp_path / "s.json")]) == 0
    assert "24 images in" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["images"] == 24


def test_info_json(shards: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(shards), "--json"]) == 0
    result, _ = _json_alone(capsys)
    assert result["rows"] == 24 and sum(result["classes"].values()) == 24


def test_info_takes_no_progress_as_every_command_does(shards: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 44, item 6: the README says every command takes --no-progress; info exited 2 ("unrecognized arguments").
    assert main(["info", str(shards), "--no-progress"]) == 0
    assert "24 rows in" in capsys.readouterr().out


def test_verify_json_lists_the_problems(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(shards), "--json"]) == 0
    assert _json_alone(capsys)[0] == {"out": str(shards), "ok": True, "problems": []}
    import shutil

    broken = Path(shutil.copytree(shards, tmp_path / "broken"))
    shard = sorted(broken.glob("shard-*.arrow"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    assert main(["verify", str(broken), "--json"]) == 1
    result, err = _json_alone(capsys)
    assert not result["ok"] and len(result["problems"]) == 1 and shard.name in result["problems"][0]
    assert shard.name in err  # the human lines moved to stderr


def test_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "clock", "--spans", "2000", "--threads", "2", "--repeats", "1", "--json",
                 "--json-file", str(tmp_path / "clock.json")]) == 0
    result, err = _json_alone(capsys)
    assert result["spans"] == 2000 and "ns / span" in err
    assert json.loads((tmp_path / "clock.json").read_text()) == result


@pytest.mark.slow
def test_train_json_is_alone_on_stdout_and_no_progress_still_prints_the_summary(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # Was: --no-progress also hid the final summary, and the summary JSON followed the table on stdout. capfd: the
    # stage processes write to the same file descriptors, and none of their lines may land on stdout. One run
    # checks both (each costs seconds); without --json the same summary goes to stdout instead of stderr.
    assert main([*TINY_TRAIN, "--out", str(tmp_path / "run"), "--no-progress", "--json"]) == 0
    result, err = _json_alone(capfd)
    assert result["steps"] == 1 and result["model"] == "mlp"
    assert "trained mlp in 1 pipeline ranks" in err and "throughput" in err
    assert "epoch 0" not in err  # the progress bar


def test_demo_json(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.stage_runtime import jobs

    # The demo's own training is tested in tests/stage_runtime/train/test_train_demo.py; here only what it prints.
    summary = {"model": "small_cnn", "stages": 2, "replicas": 1, "schedule": "1f1b", "microbatches": 4, "steps": 3,
               "wall_s": 1.0, "images_per_s": 9.0, "final_loss": 1.0, "eval_top1": 0.5,
               "input_stall_fraction": 0.1, "bubble_fraction": 0.2, "bubble_theory": 0.2}
    monkeypatch.setattr(jobs, "train", lambda config: summary)
    assert main(["demo", "--skip-bench", "--epochs", "1", "--out", str(tmp_path), "--json"]) == 0
    result, err = _json_alone(capsys)
    assert result["train"] == summary and result["ingest"]["train"]["images"] == 600 and result["bench"] is None
    assert "eval top-1 50.0%" in err


def test_the_demo_shows_the_simulated_bubble_beside_the_measured_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.stage_runtime import jobs as jobs

    summary = {"model": "small_cnn", "stages": 2, "replicas": 1, "schedule": "1f1b", "microbatches": 4, "steps": 3,
               "wall_s": 1.0, "images_per_s": 9.0, "final_loss": 1.0, "eval_top1": 0.5, "balance": [2, 5],
               "input_stall_fraction": 0.1, "bubble_fraction": 0.2, "bubble_theory": 0.2}
    predicted = {"bubble": 0.31, "images_per_s": 8.0, "link": "gloo", "causes": {
        "warmup_cooldown": 0.2, "imbalance": 0.05, "communication": 0.04, "runtime": 0.02}}
    monkeypatch.setattr(jobs, "train", lambda config: dict(summary))
    monkeypatch.setattr(jobs, "predict_run", lambda config, s: predicted)  # the calibration is tested elsewhere
    assert main(["demo", "--skip-bench", "--epochs", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "bubble predicted for this split and schedule" in out.out + out.err
    assert "31.0%" in out.out + out.err


def test_an_ingest_that_rejects_every_sample_fails_saying_where_the_reasons_are(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Was: exit code 0 and "0 images in 1 shards", a dataset the Loader then refuses.
    for name in ("a/x.jpg", "a/y.png", "b/z.jpg"):
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(b"not an image")
    out = tmp_path / "out"
    assert main(["ingest", str(tmp_path / "src"), str(out), "--workers", "1"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [f"stallfree ingest: error: nothing was ingested: all 3 samples were rejected; the reasons "
                      f"are in {out / 'rejected.jsonl'}"]
    assert len((out / "rejected.jsonl").read_text().splitlines()) == 3


SUMMARY = {"model": "mlp", "stages": 1, "replicas": 1, "schedule": "1f1b", "microbatches": 4, "steps": 1,
           "wall_s": 1.0, "images_per_s": 8.0, "final_loss": 2.0, "eval_top1": None, "input_stall_fraction": 0.0,
           "bubble_fraction": 0.0, "bubble_theory": 0.0}


@pytest.mark.parametrize("flags", [["--no-progress"], []])
def test_train_prints_the_summary_on_stdout_with_or_without_progress(
        flags: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Was: the trainer printed the summary only `if c.progress`, so --no-progress printed nothing at all.
    from stallfree.stage_runtime import jobs

    monkeypatch.setattr(jobs, "train", lambda config: SUMMARY)
    assert main([*TINY_TRAIN, "--out", str(tmp_path / "run"), *flags]) == 0
    captured = capsys.readouterr()
    assert "trained mlp in 1 pipeline ranks" in captured.out and "throughput" in captured.out
    assert captured.err == ""


def test_library_code_prints_nothing_to_stdout() -> None:
    # Was: the trainer printed its summary and the split, and the benchmarks their tables, on stdout, under the
    # JSON of --json. Below stallfree/commands, text goes to a stream the caller passes, stderr, or logging.
    import ast

    root = Path(__file__).resolve().parents[2]
    found, scanned = [], 0
    for folder in ("ingest", "pipeline", "transforms", "stage_runtime", "bench"):
        for path in sorted((root / folder).rglob("*.py")):
            scanned += 1
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                call = ast.unparse(node.func)
                if (call == "print" and not any(k.arg == "file" for k in node.keywords)) or "stdout" in call:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {call}")
    assert scanned > 40 and found == []
