"""bench plan's books table under --accelerator: the count of cells within 10% step and 3 points a part, and what
misses (the sweep itself is tests/bench/test_bench_plan.py)."""

from __future__ import annotations

import argparse
import io

from stallfree.bench.plan_report import books_cell, print_books

PARTS = {"warmup_cooldown": 0.2, "imbalance": 0.0, "communication": 0.02, "runtime": 0.05, "input": 0.01}


def _run(measured_step: float, predicted_step: float, **predicted: float) -> dict:
    ranks = [{"rank": 0, "parts": dict(PARTS)}, {"rank": 1, "parts": {**PARTS, "imbalance": 0.3}}]
    other = [{"rank": r["rank"], "parts": {**r["parts"], **predicted}} for r in ranks]
    return {"measured_step_s": measured_step, "measured_books": {"job": ranks[0], "ranks": ranks},
            "predicted_books": {"step_s": predicted_step, "job": other[0], "ranks": other}}


def test_a_cell_within_both_targets_counts_and_one_that_misses_names_the_part() -> None:
    good = books_cell([_run(0.100, 0.105), _run(0.100, 0.095)])
    assert good["books_within"] and good["books_misses"] == []
    bad = books_cell([_run(0.100, 0.115, communication=0.06)])  # +15% step, communication 4 points off
    assert not bad["books_within"] and bad["books_misses"] == ["step", "communication"]
    rows = [{"model": "mlp", "schedule": "gpipe", "stages": 2, "microbatches": m, "measured_step_s": 0.1, **cell}
            for m, cell in ((2, good), (4, bad))]
    out = io.StringIO()
    counts = print_books(argparse.Namespace(accelerator="sim:400"), rows, out)
    assert counts["within"] == 1 and counts["cells"] == 2 and counts["misses"]["communication"] == 1
    assert "1 of 2 cells within 10% step time and 3 points" in out.getvalue()


def test_the_step_is_set_beside_the_mean_step_its_books_split() -> None:
    # Median 100 ms, but one step of six met a busy machine: the run's mean step, the one its parts are shares of,
    # is 110 ms, and a prediction of 110 ms is right (it would be 10% off the median).
    run = {**_run(0.100, 0.110), "measured_mean_step_s": 0.110}
    cell = books_cell([run])
    assert cell["books_measured_step_s"] == 0.110 and cell["books_step_error"] == 0.0 and cell["books_within"]
