"""The command line: every command has --help with examples; bad input is one line and exit code 2."""

from pathlib import Path

import pytest

from stallfree.cli import COMMANDS, main


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "example" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_loader_prints_a_table_with_ratios(image_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "loader", str(image_folder), "--batch-size", "4", "--batches", "2", "--repeats", "1",
                 "--threads", "1", "--only", "stallfree", "torch", "dali", "--shards"])
    out = capsys.readouterr().out
    assert code == 0
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ") and "x |" in line]
    assert [row[1].strip() for row in rows] == [
        "stallfree", "stallfree, shards", "stallfree, shards --max-side 256", "torch DataLoader", "plain DALI"]
    assert rows[3][4].strip() == "1.00x"
    assert all(float(row[5]) >= 0 for row in rows), "every contender's cores busy (10 ms clock ticks: 0 here)"


def test_bench_resize_compares_the_resampler_with_dali_and_pil(image_folder: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "resize", str(image_folder), "--batch-size", "4", "--batches", "1", "--repeats", "1",
                 "--threads", "1"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][2:]
    assert code == 0
    names = [row[0].strip() for row in rows]
    assert names == ["stallfree resampler (Numba in DALI)", "DALI fn.resize", "PIL Image.resize"]
    assert rows[1][2].strip() == "1.00x"
    assert int(rows[0][3]) <= 1 and int(rows[2][3]) == 0  # the resampler computes PIL's filter


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "loader", "/nonexistent-data"], "image folder /nonexistent-data does not exist"),
        (["demo", "--images", "3"], "--images must be at least one batch of 64"),
    ],
)
def test_errors_are_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
