"""Issue 35, item 7: ``stallfree --version``, one ``--no-progress`` on every command (``--quiet`` kept where it was),
the demo's results kept under ``--out``, and the one-time kernel compile said once."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pytest

from stallfree import __version__
from stallfree.cli import build_parser, main, parsers
from stallfree.commands import kernels


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"stallfree {__version__}\n"


def _commands() -> list[argparse.ArgumentParser]:
    """Every parser that runs something (has ``func``): each command and each benchmark."""
    return [p for p in parsers(build_parser()) if p.get_default("func") is not None]


def test_every_command_takes_no_progress() -> None:
    found = _commands()
    assert len(found) >= 20  # demo, ingest, verify, info, train, plan, profile and the benchmarks
    for parser in found:  # info too (issue 44, item 6: "stallfree info --no-progress" exited 2), though it shows none
        flags = {o for a in parser._actions for o in a.option_strings}
        assert "--no-progress" in flags, parser.prog
        dest = next(a.dest for a in parser._actions if "--no-progress" in a.option_strings)
        assert dest == "progress", parser.prog


@pytest.mark.parametrize("command", [["ingest", "SRC", "OUT"], ["verify", "OUT"]])
def test_quiet_stays_an_alias_of_no_progress(command: list[str]) -> None:
    parser = build_parser()
    assert parser.parse_args([*command, "--quiet"]).progress is False
    assert parser.parse_args([*command, "--no-progress"]).progress is False
    assert parser.parse_args(command).progress is True


def _slow_entries(monkeypatch: pytest.MonkeyPatch, compile_s: float) -> Any:
    """A LazyEntries whose every lookup 'compiles' for ``compile_s`` (the compile itself stood in for)."""
    from stallfree.transforms.numba import abi

    monkeypatch.setattr(abi, "_entry_point", lambda function: time.sleep(compile_s) or function)

    def run() -> None: ...

    return abi.LazyEntries({0: (run, run), 1: (run, run)})


def test_a_compile_is_said_once_with_its_time(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.transforms.numba import abi

    monkeypatch.setattr(abi, "SLOW_S", 0.05)
    monkeypatch.setattr(abi, "compile_notice", None)
    entries = _slow_entries(monkeypatch, 0.2)
    kernels.announce_compiles(show=True)
    entries[0], entries[1]
    err = capsys.readouterr().err
    assert err.count("compiling stallfree's Numba kernels") == 1 and "once after installing" in err
    assert err.count("compiled in") == 2


@pytest.mark.parametrize("show", [True, False])
def test_nothing_is_said_when_the_kernels_load_fast_or_progress_is_off(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], show: bool) -> None:
    from stallfree.transforms.numba import abi

    monkeypatch.setattr(abi, "SLOW_S", 10.0 if show else 0.0)
    monkeypatch.setattr(abi, "compile_notice", None)
    entries = _slow_entries(monkeypatch, 0.05)
    kernels.announce_compiles(show=show)
    entries[0]
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_demo_keeps_its_results_under_out_and_removes_the_data(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.stage_runtime import jobs

    seen = {}

    def fake_train(config: object) -> dict[str, object]:
        seen["config"] = config
        return {"model": "small_cnn", "stages": 2, "replicas": 1, "schedule": "1f1b", "microbatches": 4,
                "steps": 3, "wall_s": 1.0, "images_per_s": 9.0, "final_loss": 1.0, "eval_top1": 0.5,
                "input_stall_fraction": 0.1, "bubble_fraction": 0.2, "bubble_theory": 0.2}

    monkeypatch.setattr(jobs, "train", fake_train)  # the demo's training is tested in test_train_demo.py
    out = tmp_path / "results"
    assert main(["demo", "--skip-bench", "--epochs", "1", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr()
    config = seen["config"]
    assert config.report.out_dir == str(out / "run") and config.report.progress is False  # type: ignore[attr-defined]
    assert not Path(config.feed.data).exists()  # type: ignore[attr-defined]  # the temporary data are gone
    assert (out / "demo.json").is_file() and f"results in {out}" in printed.out
    assert "issue" not in printed.out + printed.err
