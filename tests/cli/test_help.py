"""Every ``--help``: no reStructuredText markup, every option with a default shows it, ingest's usage is what it takes.

Issue 13, item 9: ``demo --help`` printed "``stallfree demo``", ``bench --help`` "``record`` and ``span``", train's
``--lr``, ``--epochs``, ``--seed``... had no help and no default, and ingest's usage said ``SRC OUT [SRC OUT ...]``.
``--model package.module:factory`` is found from the current directory, as ``python -m`` finds it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallfree.cli import build_parser, parsers

RST = ("``", ":class:", ":func:", ":meth:", ":mod:", ":attr:", ":data:", ".. code", ".. note")
ALL = list(parsers(build_parser()))


def test_every_subcommand_is_walked() -> None:
    names = {p.prog for p in ALL}
    assert {"stallfree demo", "stallfree ingest", "stallfree train", "stallfree bench loader",
            "stallfree bench clock", "stallfree plan", "stallfree profile", "stallfree info"} <= names


@pytest.mark.parametrize("parser", ALL, ids=[p.prog for p in ALL])
def test_help_has_no_rst_markup(parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    assert not [mark for mark in RST if mark in text], text


@pytest.mark.parametrize("parser", ALL, ids=[p.prog for p in ALL])
def test_every_option_with_a_default_shows_it(parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    entries = re.split(r"\n(?=  -)", text.split("options:", 1)[1].split("\n\n", 1)[0])
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
            continue
        (entry,) = [e for e in entries if e.lstrip().startswith(action.option_strings[0] + " ")]
        assert "default" in " ".join(entry.split()), f"{parser.prog} {action.option_strings[0]}: {entry}"


def test_a_flag_does_not_claim_a_default() -> None:
    (train,) = [p for p in ALL if p.prog == "stallfree train"]
    assert "default True" not in train.format_help() and "default False" not in train.format_help()


def test_ingest_usage_says_what_it_takes() -> None:
    (ingest,) = [p for p in ALL if p.prog == "stallfree ingest"]
    usage = ingest.format_usage()
    assert "stallfree ingest [options] SRC OUT" in usage and "stallfree ingest --merge [options] OUT" in usage
    assert "[SRC OUT ...]" not in usage


@pytest.mark.slow
def test_a_model_factory_is_found_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "tinymodels.py").write_text(textwrap.dedent("""
        import torch.nn as nn

        def make(num_classes, image_size):
            return [nn.Flatten(), nn.Linear(3 * image_size * image_size, 8), nn.ReLU(), nn.Linear(8, num_classes)]
    """))
    script = Path(sys.executable).with_name("stallfree")  # the installed command: its sys.path[0] is bin/, not cwd
    if not script.exists():
        pytest.skip(f"no installed stallfree script beside {sys.executable}")
    done = subprocess.run([str(script), "plan", "--model", "tinymodels:make", "--image-size", "8", "--devices", "2",
                           "--batch-size", "4", "--microbatches", "1", "--schedules", "gpipe", "--no-async",
                           "--threads", "1", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "--model tinymodels:make" in done.stdout
