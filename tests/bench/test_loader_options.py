"""`stallfree demo` runs a benchmark through the benchmark's own parser, not a hand-built Namespace."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallfree.commands.bench import options


def test_options_are_the_command_lines_defaults_with_overrides(tmp_path: Path) -> None:
    args = options("loader", tmp_path, batches=2, only=["torch"])
    assert args.data == tmp_path and args.batches == 2 and args.only == ["torch"]
    assert args.shards is False and args.repeats == 3 and args.batch_size == 64  # defaults from add_arguments


def test_an_unknown_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="bench loader has no option batchez"):
        options("loader", tmp_path, batchez=2)
