from __future__ import annotations

import pytest

from stallfree.cli import main


def test_help_lists_schedules_and_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "interleaved-1f1b" in out and "stallfree train ./data/train" in out
    assert "--verify {first-use,open,none}" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train"], "give a dataset folder or --synthetic N"),
        (["train", "--synthetic", "64", "--batch-size", "30"], "batch_size=30, microbatches=4"),
        (["train", "--synthetic", "64", "--schedule", "zero-bubble", "--microbatches", "3", "--batch-size", "36"],
         "use 4"),
        (["train", "--synthetic", "64", "--model", "nosuchpkg.mod:f"], "cannot import"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
