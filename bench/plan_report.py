"""The tables of ``stallfree bench plan``: what the sweep gathered (:class:`Sweep`), printed, and its counts.

The sweep itself (jobs, pilots, training and prediction) is :mod:`stallfree.bench.plan`.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from typing import Any, TextIO

from stallfree.stage_runtime.plan.books import PARTS as _BOOK_PARTS

__all__ = ["BOOKS_POINTS", "BOOKS_STEP", "BUBBLE_POINTS", "STEP_TOLERANCE", "TOP_TOLERANCE", "Sweep", "books_cell",
           "link_source", "print_attribution", "print_books", "print_cells", "print_load", "print_overheads",
           "top_choices"]

STEP_TOLERANCE, BUBBLE_POINTS, TOP_TOLERANCE = 0.15, 0.05, 0.10
BOOKS_STEP, BOOKS_POINTS = 0.10, 0.03  # under --accelerator sim:R, where only runtime and communication are predicted
_SHORT = {"warmup_cooldown": "warm", "imbalance": "imbal", "communication": "comm", "runtime": "runtime",
          "input": "input"}


@dataclass
class Sweep:
    """What the sweep gathers over its rank counts: the cells, the jobs left out, the calibrations and pilot fits."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    calibrations: dict[str, Any] = field(default_factory=dict)  # S -> Calibration.to_dict()
    pilot_fits: dict[str, dict[str, Any]] = field(default_factory=dict)  # S -> model -> PilotFit.to_dict()


def link_source(given: Any) -> str:
    """Where the link came from: ``--link``, or the calibration."""
    return "given" if given else "calibrated from measured sends"


def print_overheads(args: argparse.Namespace, given: Any, sweep: Sweep, out: TextIO) -> None:
    """Per rank count: the link, the calibrated host overhead, the pilots' fits and how the ranks share cores."""
    for stages, c in sweep.calibrations.items():
        print(f"S={stages}: link {given.describe() if given else c['link']} ({link_source(given)}); host overhead "
              f"{'not used' if args.no_overhead else 'calibrated'}:", file=out)
        for family, o in c["overhead"].items():
            print(f"  {family} schedules: {_overhead_line(o)}", file=out)
        for model, fit in sweep.pilot_fits.get(stages, {}).items():
            print(f"S={stages}, {model}: host overhead fitted from pilot jobs "
                  f"({_pilot_names(sweep.rows, model, stages)}; each run {args.repeats} time(s), taking turns with "
                  "the cells); per schedule, then per family:", file=out)
            for name, o in [*fit["schedules"].items(), *fit["families"].items()]:
                print(f"  {name}: {_overhead_line(o)}", file=out)
    for stages in dict.fromkeys(r["stages"] for r in sweep.rows):
        shared = next(r["cores"] for r in sweep.rows if r["stages"] == stages)
        alone = ("the simulated device holds no core (--accelerator)" if args.accelerator is not None
                 else "each simulated rank computes on cores of its own (--no-sharing)")
        print(f"S={stages}: " + (f"the simulated ranks share {shared['count']} cores, {shared['threads']} torch "
                                 f"thread(s) each, as the stage processes do" if shared else alone), file=out)


def print_cells(args: argparse.Namespace, rows: list[dict[str, Any]], out: TextIO) -> dict[str, Any]:
    """The table of cells and the counts within the targets; returns those counts and the top choices."""
    print(f"batch {args.batch_size}, {args.steps} steps per job, medians after the first, medians of "
          f"{args.repeats} run(s) of each job; step = the pipeline's step timed whole (stage 0 holding its batch to "
          "the last rank's last action), the optimizer outside it (as the trainer measures)", file=out)
    print(f"| {'model':<9} | {'schedule':<16} | {'S':>1} | {'M':>2} | {'step ms meas.':>13} | {'pred.':>8} | "
          f"{'error':>6} | {'bubble meas.':>12} | {'pred.':>6} | ok  | pilot |", file=out)
    print(f"|{'-' * 11}|{'-' * 18}|{'-' * 3}|{'-' * 4}|{'-' * 15}|{'-' * 10}|{'-' * 8}|{'-' * 14}|{'-' * 8}|-----|"
          "-------|", file=out)
    for r in rows:
        print(f"| {r['model']:<9} | {r['schedule']:<16} | {r['stages']:>1} | {r['microbatches']:>2} | "
              f"{r['measured_step_s'] * 1e3:>13.1f} | {r['predicted_step_s'] * 1e3:>8.1f} | "
              f"{r['step_error']:>+6.0%} | {r['measured_bubble']:>12.1%} | {r['predicted_bubble']:>6.1%} | "
              f"{'yes' if r['within'] else 'no':<3} | {'yes' if r['pilot_config'] else '':<5} |", file=out)
    return _print_counts(args, rows, out)


def _print_counts(args: argparse.Namespace, rows: list[dict[str, Any]], out: TextIO) -> dict[str, Any]:
    """How many cells are within the targets, with and without pilots, and each model's top choice."""
    hits = _hits(rows)
    others = [r for r in rows if not r["pilot_config"]]
    print(f"{hits} of {len(rows)} cells within {STEP_TOLERANCE:.0%} step time and {BUBBLE_POINTS * 100:.0f} bubble "
          f"points" + (f"; of the {len(others)} cells whose configuration no pilot ran, {_hits(others)}"
                       if len(others) < len(rows) else ""), file=out)
    spread = statistics.median(r["runs_spread"] for r in rows) if rows else None
    if spread is not None and args.repeats > 1:
        print(f"a cell's {args.repeats} runs, slowest over fastest: median {spread:.2f} over the cells (how much this "
              f"machine moved between runs of one job; the step target allows {STEP_TOLERANCE:.0%})", file=out)
    compared = [r for r in rows if "calibration_only" in r]
    if compared:
        print(f"the same runs predicted from the near-empty pipeline's calibration alone (--no-pilots): "
              f"{sum(r['calibration_only']['within'] for r in compared)} of the {len(compared)} cells the pilots "
              f"predicted (those: {_hits(compared)})", file=out)
    tops = top_choices(rows)
    for t in tops:
        print(f"{t['model']}: the top choice of {t['cells']} cells, {_name(t['top'])}, is "
              f"{t['slower_than_fastest']:.0%} slower than the fastest measured, {_name(t['fastest'])}: "
              f"{'within' if t['within'] else 'not within'} {TOP_TOLERANCE:.0%}", file=out)
    return {"within": hits, "cells": len(rows), "median_runs_spread": spread,
            "within_without_pilot_config": _hits(others), "cells_without_pilot_config": len(others),
            "within_calibration_only": sum(r["calibration_only"]["within"] for r in compared) if compared else None,
            "top_choice": tops}


def top_choices(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model: the cell predicted fastest beside the cell measured fastest, and whether it is within 10%."""
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        cells = [r for r in rows if r["model"] == model]
        top = min(cells, key=lambda r: r["predicted_step_s"])
        fastest = min(cells, key=lambda r: r["measured_step_s"])
        ratio = top["measured_step_s"] / fastest["measured_step_s"]
        out.append({"model": model, "cells": len(cells), "top": _cell(top), "fastest": _cell(fastest),
                    "slower_than_fastest": ratio - 1, "within": ratio - 1 <= TOP_TOLERANCE})
    return out


def _cell(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("schedule", "stages", "microbatches", "measured_step_s", "predicted_step_s")}


def _name(cell: dict[str, Any]) -> str:
    return f"{cell['schedule']} S={cell['stages']} M={cell['microbatches']} ({cell['measured_step_s'] * 1e3:.1f} ms)"


def print_load(start: tuple[float, float, float], end: tuple[float, float, float], out: TextIO) -> None:
    """How busy the machine was: the load averages at the start and the end."""
    print(f"load average (1, 5, 15 min) {_load(start)} at the start, {_load(end)} at the end", file=out)


def _load(avg: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.1f}" for v in avg)


def _overhead_line(o: dict[str, Any]) -> str:
    kinds = ", ".join(f"{k} {v * 1e6:.0f}" for k, v in o["kind_s"].items())
    return (f"us per action {kinds}; {o['gap_s'] * 1e6:.0f} us between actions, {o['send_s'] * 1e6:.0f} us per "
            f"send, {o['message_s'] * 1e6:.0f} us per receive, {o.get('wire_s', 0.0) * 1e6:.0f} us per message "
            f"beyond the link, {o['step_s'] * 1e6:.0f} us per step")


def _pilot_names(rows: list[dict[str, Any]], model: str, stages: str) -> str:
    return ", ".join(f"{r['schedule']} M={r['microbatches']}" for r in rows
                     if r["model"] == model and str(r["stages"]) == stages and r["pilot_config"])


def _hits(rows: list[dict[str, Any]]) -> int:
    return sum(r["within"] for r in rows)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def _mean_message(values: dict[str, float], samples: dict[str, int] | None, kind: str) -> float | None:
    """The mean of the ``kind`` (act or grad) messages, weighted by their counts where given."""
    keys = [k for k in values if k.startswith(kind)]
    if not keys:
        return None
    weights = [samples.get(k, 1) if samples else 1 for k in keys]
    return sum(values[k] * w for k, w in zip(keys, weights, strict=True)) / sum(weights)


def print_attribution(rows: list[dict[str, Any]], out: TextIO) -> None:
    """Per cell, measured / predicted milliseconds: one action of each kind, one message each way, one send."""
    if not rows:
        return
    print("per action kind, message and send: mean ms measured / predicted (from the trainer's spans after the "
          "first step, and the simulated step's)", file=out)
    print(f"| {'model':<9} | {'schedule':<16} | S |  M | {'F':>11} | {'B':>11} | {'I':>11} | {'W':>11} | "
          f"{'act':>11} | {'grad':>11} | {'send':>11} |", file=out)
    print(f"|{'-' * 11}|{'-' * 18}|---|----|" + f"{'-' * 13}|" * 7, file=out)
    for r in rows:
        m, p = r["measured_spans"], r["predicted_spans"]
        cells = [f"{_ms(m['per_action_s'].get(k))} / {_ms(p['per_action_s'].get(k))}"
                 if k in m["per_action_s"] or k in p["per_action_s"] else "-" for k in ("F", "B", "I", "W")]
        cells += [f"{_ms(_mean_message(m['per_message_s'], m['samples'], k))} / "
                  f"{_ms(_mean_message(p['per_message_s'], None, k))}" for k in ("act", "grad")]
        cells.append(f"{_ms(m['send_s'])} / {_ms(p['send_s'])}")
        print(f"| {r['model']:<9} | {r['schedule']:<16} | {r['stages']} | {r['microbatches']:>2} | "
              + " | ".join(f"{c:>11}" for c in cells) + " |", file=out)


def books_cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell's books from its runs: per rank and part, the medians measured and predicted.

    Also whether the step is within 10% and every part of every rank within 3 points (``books_misses`` names what
    is not).
    """
    ranks = len(runs[0]["measured_books"]["ranks"])
    measured = [{p: statistics.median(r["measured_books"]["ranks"][k]["parts"][p] for r in runs)
                 for p in _BOOK_PARTS} for k in range(ranks)]
    predicted = [{p: statistics.median(r["predicted_books"]["ranks"][k]["parts"][p] for r in runs)
                  for p in _BOOK_PARTS} for k in range(ranks)]
    # the pipeline's whole step, as the trainer times it and the simulated step ends (the last action of any rank);
    # the measured one is each run's mean step, as its books split it (their parts are shares of the mean)
    predicted_step = statistics.median(r["predicted_books"]["step_s"] for r in runs)
    measured_step = statistics.median(r.get("measured_mean_step_s", r["measured_step_s"]) for r in runs)
    step_error = predicted_step / measured_step - 1
    misses = ["step"] if abs(step_error) > BOOKS_STEP else []
    misses += [p for p in _BOOK_PARTS if any(abs(m[p] - q[p]) > BOOKS_POINTS for m, q in zip(measured, predicted,
                                                                                            strict=True))]
    job = runs[0]["measured_books"]["job"]["rank"]
    return {"books_measured": measured, "books_predicted": predicted, "books_job_rank": job,
            "books_measured_step_s": measured_step,
            "books_predicted_step_s": predicted_step, "books_step_error": step_error,
            "books_within": not misses, "books_misses": misses}


def print_books(args: argparse.Namespace, rows: list[dict[str, Any]], out: TextIO) -> dict[str, Any]:
    """Under ``--accelerator``: per cell, the step and the slowest rank's loss by part, measured / predicted.

    Then the count of cells whose step is within 10% and every rank's every part within 3 points.
    """
    print(f"the books under {args.accelerator} (compute known; step: the pipeline's whole step, a run's mean; parts: "
          f"percent of the step, the slowest rank's, measured / predicted; the prediction has no input); ok = step "
          f"within {BOOKS_STEP:.0%} and every rank's parts within {BOOKS_POINTS * 100:.0f} points", file=out)
    print(f"| {'model':<9} | {'schedule':<16} | S |  M | {'step ms':>15} | "
          + " | ".join(f"{_SHORT[p]:>11}" for p in _BOOK_PARTS) + " | ok  |", file=out)
    print(f"|{'-' * 11}|{'-' * 18}|---|----|{'-' * 17}|" + f"{'-' * 13}|" * len(_BOOK_PARTS) + "-----|", file=out)
    cells = [r for r in rows if "books_within" in r]
    for r in cells:
        k = r["books_job_rank"]
        m, q = r["books_measured"][k], r["books_predicted"][k]
        parts = [f"{m[p] * 100:.1f} / {q[p] * 100:.1f}" for p in _BOOK_PARTS]
        step = f"{r['books_measured_step_s'] * 1e3:.1f} / {r['books_predicted_step_s'] * 1e3:.1f}"
        print(f"| {r['model']:<9} | {r['schedule']:<16} | {r['stages']} | {r['microbatches']:>2} | {step:>15} | "
              + " | ".join(f"{c:>11}" for c in parts) + f" | {'yes' if r['books_within'] else 'no':<3} |", file=out)
    hits = sum(r["books_within"] for r in cells)
    misses = {what: sum(what in r["books_misses"] for r in cells) for what in ("step", *_BOOK_PARTS)}
    print(f"{hits} of {len(cells)} cells within {BOOKS_STEP:.0%} step time and {BOOKS_POINTS * 100:.0f} points on "
          f"every part of every rank; cells missing, by what misses: "
          + ", ".join(f"{_SHORT.get(k, k)} {v}" for k, v in misses.items()), file=out)
    return {"within": hits, "cells": len(cells), "misses": misses}
