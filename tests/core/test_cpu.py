"""The one CPU-seconds meter counts a process's children, living and reaped: a DataLoader works in its workers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stallfree.core.cpu import cpu_seconds

BURN = "import time\nx = 0\nfor i in range(3_000_000): x += i\nprint(time.process_time(), flush=True)\n"


def test_a_reaped_child_is_counted() -> None:
    before = cpu_seconds()
    child = float(subprocess.run([sys.executable, "-c", BURN], capture_output=True, text=True, check=True).stdout)
    assert cpu_seconds() - before >= 0.9 * child


def test_a_living_child_is_counted_and_so_is_another_process() -> None:
    script = BURN + "import sys\nsys.stdin.read()\n"  # waits, alive, once it has burned and said how much
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        burned = float(child.stdout.readline())
        assert cpu_seconds() >= burned * 0.9  # this process's total holds the living child's seconds
        assert cpu_seconds(child.pid) >= burned * 0.9
    finally:
        child.communicate("")


def test_a_process_that_is_gone_is_named_by_psutil() -> None:
    import psutil

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(psutil.NoSuchProcess):
        cpu_seconds(gone.pid)
