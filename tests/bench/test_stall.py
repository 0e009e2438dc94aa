"""`stallfree bench stall`: the wait split that adds up, the result's shape, argument errors (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.bench.stall import parts
from stallfree.cli import main


def test_the_three_parts_add_up_to_the_stall() -> None:
    waits = [0.060, 0.0003, 0.0002, 0.012, 0.0004, 0.027]  # the first batch, hand-offs, two batches not made yet
    ready = [False, True, True, False, True, False]
    split = parts(waits, ready, wall=2.0)
    assert split["start"] == pytest.approx(0.030)
    assert split["handoff"] == pytest.approx((0.0003 + 0.0002 + 0.0004) / 2.0)
    assert split["jitter"] == pytest.approx((0.012 + 0.027) / 2.0)
    assert split["start"] + split["handoff"] + split["jitter"] == pytest.approx(split["stall"])
    assert split["late"] == 2 and split["late_max_ms"] == pytest.approx(27.0)
    assert split["first_ms"] == pytest.approx(60.0) and split["handoff_max_ms"] == pytest.approx(0.4)


def test_a_tiny_run_writes_every_epoch_and_its_waits(image_folder: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    result_path = tmp_path / "stall.json"
    code = main(["bench", "stall", str(image_folder), "--synthetic", "0", "--epochs", "2", "--runs", "1",
                 "--batch-size", "4", "--threads", "1", "--build-s", "0.2", "--no-progress", "--shares",
                 "--json-file", str(result_path)])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(result_path.read_text())
    batches = result["batches"]
    (run,) = result["runs"]
    assert run["speed"] == pytest.approx(0.8 * run["standalone"])
    for epoch in [*run["epochs"], *run["fresh"].values()]:
        assert len(epoch["waits_ms"]) == batches + 1  # every batch, and the next() that ends the epoch
        assert epoch["images"] == batches * 4
        assert epoch["start"] + epoch["handoff"] + epoch["jitter"] == pytest.approx(epoch["stall"])
        assert epoch["of_r"] + epoch["stall"] + epoch["overrun"] == pytest.approx(1.0)
    assert len(run["epochs"]) == 2 and set(run["fresh"]) == {"cold", "started"}
    assert set(result["summary"]) == {"first", "rest", "cold", "started"}
    assert "a fresh Loader's first epoch, start()ed (median)" in out
    assert result["loop"]["cells"] == []  # --shares with none: no loop


def test_the_loop_times_its_python_beside_every_feed(image_folder: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    result_path = tmp_path / "stall.json"
    code = main(["bench", "stall", str(image_folder), "--synthetic", "0", "--epochs", "1", "--runs", "1",
                 "--batch-size", "4", "--threads", "1", "--build-s", "0", "--no-progress", "--shares", "0", "0.3",
                 "--loop-epochs", "2", "--json-file", str(result_path)])
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(result_path.read_text())
    cells = result["loop"]["cells"]
    assert [(c["feed"], c["share"]) for c in cells] == [
        (feed, share) for share in (0.0, 0.3)
        for feed in ("stallfree", "stallfree, graph in the loop's process", "torch DataLoader", "plain DALI")]
    for cell in cells:
        assert len(cell["waits_ms"]) == 2 * result["batches"]  # every step of --loop-epochs epochs timed
        assert 0 <= cell["stall"] <= 1 and cell["speed"] == pytest.approx(0.8 * cell["beside_loop"])
        if cell["share"] == 0:
            assert cell["work_units"] is None and cell["slowdown"] is None
            assert cell["beside_loop"] == cell["standalone"]
        else:  # the work ran in the loop and alone, and the slowdown compares the two
            assert cell["work_units"] >= 1 and cell["work_alone_ms"] > 0 and cell["work_run_ms"] > 0
            assert cell["slowdown"] == pytest.approx(cell["work_run_ms"] / cell["work_alone_ms"] - 1)
            assert cell["work_alone_cpu_ms"] > 0 and cell["work_run_cpu_ms"] > 0  # the share of it the core ran
    rows = result["loop"]["summary"]
    assert len(rows) == 8 and all(row["runs"] == 1 for row in rows)
    assert "| torch DataLoader | 30% (" in out and "the loop's Python slowed by < 5%" in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--load", "1.5"], "--load must be in (0, 1], a share of the Loader's stand-alone rate, got 1.5"),
        (["--epochs", "0"], "--epochs must be positive, got 0"),
        (["--switch-interval-ms", "0"], "--switch-interval-ms must be positive, got 0.0"),
        (["--batch-size", "1000"], "fewer than one batch of 1000"),
        (["--shares", "0.3", "1"], "--shares must be in [0, 1), each a share of the step spent in the loop's Python, "
                                   "got [1.0]"),
        (["--loop-epochs", "0"], "--loop-epochs must be positive, got 0"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(image_folder: Path, extra: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "stall", str(image_folder), "--synthetic", "0", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
