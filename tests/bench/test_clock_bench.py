"""`stallfree bench clock` runs and writes its figures (no timed assertions: it reports, it does not judge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main


def test_bench_clock_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "clock.json"
    assert main(["bench", "clock", "--spans", "2000", "--threads", "2", "--repeats", "1", "--json-file", str(out)]) == 0
    assert "ns / span" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert set(result["median_ns"]) == {"record, 1 thread", "span(), 1 thread", "record, 2 threads",
                                        "ring buffer full (drops)"}
    assert result["bytes_per_span"] > 0
