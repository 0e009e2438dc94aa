"""`stallfree demo` runs a benchmark through the benchmark's own parser, not a hand-built Namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallfree.commands.bench import options


def test_options_are_the_command_lines_defaults_with_overrides(tmp_path: Path) -> None:
    args = options("loader", tmp_path, batches=2, only=["torch"])
    assert args.data == tmp_path and args.batches == 2 and args.only == ["torch"]
    assert args.shards is False and args.repeats == 3 and args.batch_size == 64  # defaults from add_arguments


def test_options_hold_what_the_bench_command_adds(tmp_path: Path) -> None:
    # Issue 44, item 1: the demo's `options("e2e", ..., progress=...)` raised "TypeError: bench e2e has no option
    # progress": the command line's --no-progress and --json were added to the command's parser only.
    args = options("e2e", tmp_path, synthetic=64, speeds=[], feeds=["stallfree", "torch"], batches=1, warmup=5,
                   png=tmp_path / "e2e.png", goals=False, progress=False)
    assert args.progress is False and args.synthetic == 64 and args.feeds == ["stallfree", "torch"]
    assert options("e2e", tmp_path).progress is True and args.json is False and args.json_file is None


def test_an_unknown_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="bench loader has no option batchez"):
        options("loader", tmp_path, batchez=2)


def test_rounds_run_the_contenders_in_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With --rounds, a slow spell of a shared machine must fall on every contender, not on whichever ran then.
    from stallfree.bench import loader as bench_loader

    built: list[str] = []

    def fake(name: str):
        def stream(args):
            built.append(name)
            while True:
                yield None
        return stream

    monkeypatch.setitem(bench_loader.CONTENDERS, "torch", fake("torch"))
    monkeypatch.setitem(bench_loader.CONTENDERS, "dali", fake("dali"))
    args = options("loader", tmp_path, batches=2, repeats=2, rounds=3)
    runs = [("a", "torch", tmp_path), ("b", "dali", tmp_path)]
    rates = bench_loader.measure_runs(runs, args)
    assert built == ["torch", "dali"] * 3
    assert {label: len(values) for label, values in rates.items()} == {"a": 6, "b": 6}
