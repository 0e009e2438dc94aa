"""``stallfree train``'s hostile arguments (issue 44, item 13): each bad value is refused before any process starts,
in one line naming the flag, and the ``--transform`` spec is bounded and read in time linear in its length."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.stage_runtime.train.augment import MAX_SPEC, parse_spec

SMALL = ["--model", "mlp", "--image-size", "4", "--batch-size", "8", "--no-progress"]
DATA = "DATA"  # replaced by the image_folder fixture: --transform applies to a dataset's images


@pytest.mark.parametrize(("argv", "message"), [
    # each one used to fail inside the run or not at all: a TypeError traceback, a MemoryError traceback, a NaN loss
    # with exit 0, an OverflowError or a C++ stack trace once the stages had started, 0 steps with exit 0, a delay
    # silently not applied
    ([DATA, "--transform", "os:system"], r"^--transform 'os:system': calling it with no arguments failed "
                                         r"\(.*\); give a function that takes none and returns a transform$"),
    ([DATA, "--transform=" + "-" * 100_000], rf"^--transform is 100000 characters long, over the {MAX_SPEC} a spec "
                                            r"may have; write a longer transform as a function"),
    ([DATA, "--transform", "RandomHorizontalFlip(), " * 2000], r"^--transform is 48000 characters long"),
    ([DATA, "--transform=" + "-" * 3000 + "1"], r"^--transform '-+ \.\.\. -+1' nests too deeply for Python's parser"),
    (["--synthetic", "64", "--lr", "inf"], r"^--lr must be a finite number > 0, got inf$"),
    (["--synthetic", "64", "--momentum", "nan"], r"^--momentum must be a finite number >= 0, got nan$"),
    (["--synthetic", "64", "--link-delay", "0-1:1e999"],
     r"^--link-delay 0-1:1e999: the delay must be a finite number of ms >= 0, got inf$"),
    (["--synthetic", "64", "--link-delay", "0-1:400000"],
     r"^--link-delay 0-1:400000 holds a message 400 s, as long as --timeout 300 s lets a collective wait"),
    (["--synthetic", "64", "--timeout", "0"], r"^--timeout must be a number of seconds from 1 to 604800 \(a week\), "
                                              r"got 0$"),
    (["--synthetic", "64", "--timeout", "inf"], r"^--timeout must be a number of seconds from 1 to 604800"),
    (["--synthetic", "64", "--max-steps", "-1"], r"^--max-steps must be >= 1, got -1 \(leave it out to run every "
                                                 r"epoch\)$"),
    (["--synthetic", "64", "--max-steps", "0"], r"^--max-steps must be >= 1, got 0"),
    (["--synthetic", "64", "--checkpoint-every", "-1"], r"^--checkpoint-every must be >= 0, got -1$"),
    (["--synthetic", "64", "--threads", "0"], r"^--threads must be >= 1, got 0$"),
    (["--synthetic", "4"], r"^--synthetic 4 is less than one batch per replica \(--batch-size 8 x --dp 1\)"),
    (["--synthetic", "64", "--schedule", "2bw", "--link-delay", "0-1:300"],
     r"^--link-delay is not run under --schedule 2bw: .* use --schedule 1f1b, its order with a flush, or drop "
     r"--link-delay$"),
])
def test_a_bad_value_is_refused_in_one_line_naming_its_flag(argv: list[str], message: str, image_folder: Path,
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(image_folder) if a == DATA else a for a in argv]
    assert main(["train", *argv, *SMALL, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    prefix = "stallfree train: error: "
    assert err.startswith(prefix), err
    assert __import__("re").search(message, err.strip()[len(prefix):]), err
    assert not (tmp_path / "run").exists()  # refused before the run's folder, let alone its processes


@pytest.mark.slow
def test_a_factory_in_the_current_folder_is_found_as_python_m_finds_it(
        image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: "No module named 'myaug'": the stallfree script puts its own folder first on sys.path, not this one.
    (tmp_path / "myaug.py").write_text(textwrap.dedent("""
        from stallfree.transforms import Normalize, RandomResizedCrop

        def fn():
            return [RandomResizedCrop(4, scale=(0.5, 1.0)), Normalize()]
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "myaug", raising=False)
    assert main(["train", str(image_folder), "--transform", "myaug:fn", "--stages", "1", "--microbatches", "1",
                 "--max-steps", "1", "--timeout", "120", *SMALL, "--out", "run"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["config"]["transform"] == "myaug:fn"
    sys.modules.pop("myaug", None)


def test_a_spec_just_within_the_bound_still_parses() -> None:
    spec = ", ".join(["RandomHorizontalFlip()"] * (MAX_SPEC // 24))
    assert len(spec) <= MAX_SPEC and len(parse_spec(spec)) == MAX_SPEC // 24


def _work(spec: str) -> int:
    """The function calls (Python's and C's) parsing ``spec`` makes: a count, not a time."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        parse_spec(spec)
    finally:
        sys.setprofile(None)
    return calls


def test_the_spec_is_read_in_time_linear_in_its_length() -> None:
    # Before: ast.get_source_segment split the whole spec into lines once per item, a Python loop over every
    # character each time: a 48 KB spec took 20 s to refuse, 96 KB 67 s.
    item = "RandomHorizontalFlip(p=0.5), "
    small, large = (item * n for n in (30, 120))
    ratio = _work(large) / _work(small)
    assert ratio < 6, f"4x the spec cost {ratio:.1f}x the calls (quadratic would be ~16x)"
