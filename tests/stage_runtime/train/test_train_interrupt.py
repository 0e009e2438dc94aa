"""Ctrl-C in the launching process stops every stage process within seconds and leaves none behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow  # a training job interrupted in a subprocess

SCRIPT = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background child inherits SIGINT ignored
from stallfree.cli import main
if __name__ == "__main__":
    sys.exit(main(["train", "--synthetic", "200000", "--model", "mlp", "--image-size", "8", "--no-progress",
                   "--out", sys.argv[1]]))
"""


def test_ctrl_c_stops_all_stage_processes(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "run")], stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "train.jsonl").exists() and time.monotonic() < deadline:  # training has begun
        time.sleep(0.2)
    children = parent.children(recursive=True)
    assert len(children) >= 2
    proc.send_signal(signal.SIGINT)
    try:
        assert proc.wait(timeout=20) == 130
    finally:
        proc.kill()
    assert proc.stderr is not None and "stallfree train: interrupted" in proc.stderr.read()
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == []
