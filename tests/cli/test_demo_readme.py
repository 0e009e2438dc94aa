"""``stallfree demo`` as the README gives it, every step (the bench included), in a subprocess as a user runs it.

Issue 44, item 1: the README's first command exited 1 before its chart with "TypeError: bench e2e has no option
progress" (the demo built the e2e bench's options without the ``--no-progress`` flag the bench command adds), and
every demo test passed ``--skip-bench``. The only difference from the README here is ``STALLFREE_DEMO_QUICK=1``
(fewer images and one epoch, the same code path), as ``.ci/run`` runs the README's set-up line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stallfree.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _readme_demo_command() -> list[str]:
    """The last command of the README's set-up line (``... && stallfree demo``), as argv."""
    setup = re.search(r"^## Set up\n.*?^```bash\n(.+?)\n", (ROOT / "README.md").read_text(), re.S | re.M)
    assert setup is not None, "README.md has no '## Set up' section with a bash block"
    command = shlex.split(setup[1].rsplit("&&", 1)[1])
    assert command[0] == "stallfree", setup[1]
    return command


@pytest.mark.slow
def test_the_readme_demo_runs_every_step(tmp_path: Path) -> None:
    command = _readme_demo_command()
    script = Path(sys.executable).with_name("stallfree")  # the console script pip installed beside this Python
    assert script.is_file(), f"no {script}: install the package (pip install -e .)"
    done = subprocess.run([str(script), *command[1:]], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, env={**os.environ, "STALLFREE_DEMO_QUICK": "1"}, timeout=280)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr and "== 1/3 end to end" in done.stderr
    out = tmp_path / "stallfree-demo"  # the default --out, in the current folder
    result = json.loads((out / "demo.json").read_text())
    assert result["bench"]["images"] == 64  # STALLFREE_DEMO_QUICK's size
    target = result["bench"]["target"]  # both feeds measured behind the simulated device
    assert target["stallfree"] > 0 and target["torch"] > 0, target
    assert (out / "e2e.png").stat().st_size > 0 and "chart: stallfree-demo/e2e.png" in done.stdout
    assert result["ingest"]["train"]["images"] == 600 and result["train"]["steps"] > 0
    assert "eval top-1" in done.stdout and f"results in {out.name}: e2e.png (the chart)" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stallfree-demo"]  # the data went to a temporary folder


def test_flags_win_over_the_quick_sizes_and_a_bad_value_is_named(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STALLFREE_DEMO_QUICK", "1")
    assert main(["demo", "--images", "3"]) == 2
    assert "--images must be at least one batch of 64, got 3" in capsys.readouterr().err
    monkeypatch.setenv("STALLFREE_DEMO_QUICK", "yes")
    assert main(["demo"]) == 2
    assert ("STALLFREE_DEMO_QUICK must be 1 (a quick demo on less data) or 0, got 'yes'"
            in capsys.readouterr().err)
