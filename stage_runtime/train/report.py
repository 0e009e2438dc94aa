"""The training report: a progress bar per epoch, ``train.jsonl`` rows, and the final summary.

Two fractions describe where time goes, both measured by the stage clock's spans:

- input stall = time stage 0 waited for the Loader / step time (step time = wait + the pipeline's step);
- throughput = images, or for a token model's job token positions (padding included: ``batch x seq_len``), over all
  replicas per second: ``images_per_s`` or ``tokens_per_s``, in ``train.jsonl`` and the summary;
- bubble = idle time of the pipeline ranks inside the pipeline's step / (ranks x its time), shown beside the
  schedule's theory.

The pipeline's step is timed whole: from stage 0 holding its batch to the end of the last rank's schedule step
(:meth:`Report.step`), on ``time.perf_counter``, the clock every process of a machine shares. With ``--dp N`` the
job's step runs on to the end of the slowest replica's pipeline, which the gradient all-reduce waits for: that wait
is the step's data-parallel imbalance (:attr:`Report.step_loads`, the books' "data-parallel imbalance").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from stallfree.core.atomic import atomic_write

__all__ = ["Report", "format_summary"]


class Report:
    """Accumulates per-step figures on the logging rank and writes ``train.jsonl`` (one row per logged step)."""

    def __init__(self, out_dir: Path, ranks: int, replicas: int, progress: bool, log_every: int = 1,
                 resume_step: int | None = None, unit: str = "images"):
        """Open ``train.jsonl``: anew, or continued when ``resume_step`` is the step of the checkpoint resumed.

        On resume the rows after that step are dropped (the resumed run writes them again): each step once.
        ``unit``: what the throughput counts, ``"images"`` or ``"tokens"`` (its key is ``{unit}_per_s``).
        """
        self.unit = unit
        self.path = out_dir / "train.jsonl"
        out_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.is_file():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and _row_step(line) <= resume_step]
            atomic_write(self.path, "".join(f"{line}\n" for line in kept).encode())
        self._file = open(self.path, "a" if resume_step is not None else "w")  # noqa: SIM115 - kept open
        self.ranks, self.replicas, self.progress, self.log_every = ranks, replicas, progress, log_every
        self.totals: dict[str, float] = {"wait_s": 0.0, "step_s": 0.0, "busy_s": 0.0, "images": 0, "steps": 0,
                                         "compute_step_s": 0.0}
        self.step_times: list[tuple[float, float]] = []  # per step of this run: input stall, the pipeline's step
        # per step of this run: replica 0's wait for the slowest replica, its batch's work, the replicas' mean work
        # and mean padding slots
        self.step_loads: list[tuple[float, float, float, float]] = []
        self._end: float | None = None  # when the last step's pipeline ended (None: after a synchronisation)
        self._bar: Any = None
        self._first: dict[str, float] | None = None
        self.last_loss = float("nan")

    def epoch(self, epoch: int, steps: int, done: int = 0) -> None:
        """Open the progress bar of ``epoch`` (``steps`` steps, ``done`` of them already run when resuming)."""
        if self.progress:
            from tqdm import tqdm

            self._bar = tqdm(total=steps, initial=done, desc=f"epoch {epoch}", file=sys.stderr, unit="step",
                             dynamic_ncols=True, leave=True)

    def synced(self) -> None:
        """Every rank met (checkpoint, evaluation): the next step is timed from its own start, not the last's end."""
        self._end = None

    def step(self, step: int, epoch: int, *, loss: float, wait_s: float, t0: float, start: float, end: float,
             busy_s: float, images: int, lr: float | None = None, replicas_end: float | None = None,
             work: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        """Add one step, timed whole over the pipeline on the clock every process of a machine shares.

        ``t0``: when stage 0 began reading the step's batch (``wait_s`` then passed), ``start`` when its schedule
        step began, ``end`` when the last rank's ended; ``busy_s`` the ranks' summed compute. The pipeline's step
        runs from stage 0 holding its batch, or from the previous step's end if later (the ranks overlap
        consecutive steps where nothing waits between them: ``2bw``, the zero-bubble schedules' tail), to ``end``;
        the input stall is the part of the wait not hidden under the previous step. ``images``: the units one
        replica's batch holds (images, or token positions). Steps then never overlap, so no
        time is counted twice; rank 0's time between a step's end and its next read (its optimizer step) is in
        neither, as the plan simulator's step leaves it out.

        ``replicas_end``: when the slowest replica's pipeline ended (``--dp N`` on one machine; None: this
        replica's ``end``): the step runs on to it, the gradient all-reduce waiting for it (data-parallel imbalance).
        ``work``: this replica's batch's work (images, or its tokens' cost), the replicas' mean work and their mean
        padding slots.
        """
        after = self._end if self._end is not None else float("-inf")
        dp_wait_s = max(0.0, replicas_end - end) if replicas_end is not None else 0.0
        self._end = end + dp_wait_s
        pipe_s = end - max(t0 + wait_s, after)
        wait_s = max(0.0, min(wait_s, t0 + wait_s - after))
        # The first step of a run pays for warm-up (DataLoader workers starting, first sends, allocations); the
        # summary leaves it out when there are others, train.jsonl keeps it.
        self.step_times.append((wait_s, pipe_s))
        self.step_loads.append((dp_wait_s, *work))
        figures = {"wait_s": wait_s, "compute_step_s": pipe_s, "step_s": wait_s + pipe_s + dp_wait_s,
                   "busy_s": busy_s, "images": images * self.replicas, "steps": 1}
        if self._first is None:
            self._first = figures
        else:
            for key, value in figures.items():
                self.totals[key] += value
        self.last_loss = loss
        step_s = wait_s + pipe_s + dp_wait_s
        row = {
            "step": step, "epoch": epoch, "loss": round(loss, 6),
            f"{self.unit}_per_s": round(images * self.replicas / step_s, 2) if step_s > 0 else None,
            "input_stall": round(wait_s / step_s, 4) if step_s > 0 else 0.0,
            "bubble": round(max(0.0, 1 - busy_s / (self.ranks * pipe_s)), 4) if pipe_s > 0 else 0.0,
            "step_s": round(step_s, 5),
            "compute_step_s": round(pipe_s, 5),  # the pipeline's step alone, what the plan simulator predicts
        }
        if replicas_end is not None:
            row["dp_wait_s"] = round(dp_wait_s, 5)  # replica 0 waiting for the slowest replica at the all-reduce
        if lr is not None:
            row["lr"] = lr
        if step % self.log_every == 0:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        if self._bar is not None:
            rate = {"img_s" if self.unit == "images" else "tok_s": f"{row[f'{self.unit}_per_s'] or 0:.0f}"}
            self._bar.set_postfix(loss=f"{loss:.3f}", **rate,
                                  stall=f"{row['input_stall']:.0%}", bubble=f"{row['bubble']:.0%}", refresh=False)
            self._bar.update(1)

    def eval(self, epoch: int, step: int, accuracy: float) -> None:
        """Log an evaluation row and close the epoch's bar."""
        self.close_bar()
        self._file.write(json.dumps({"step": step, "epoch": epoch, "eval_top1": round(accuracy, 5)}) + "\n")
        self._file.flush()

    def close_bar(self) -> None:
        """Close the progress bar if open."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def fractions(self) -> dict[str, float]:
        """Measured input-stall and bubble fractions and throughput over the steps after the first."""
        t = self.totals if self.totals["steps"] else (self._first or self.totals)
        return {
            "input_stall_fraction": t["wait_s"] / t["step_s"] if t["step_s"] else 0.0,
            "bubble_fraction": max(0.0, 1 - t["busy_s"] / (self.ranks * t["compute_step_s"]))
            if t["compute_step_s"] else 0.0,
            f"{self.unit}_per_s": t["images"] / t["step_s"] if t["step_s"] else 0.0,
        }

    def mean_work(self) -> float:
        """Replica 0's mean batch work (images, or its tokens' cost) over the steps after the first."""
        works = [load[1] for load in self.step_loads]
        works = works[1:] or works
        return sum(works) / len(works) if works else 0.0

    def measured_seconds(self) -> tuple[float, float]:
        """The seconds and the units (images or token positions) the throughput is over: the steps after the first."""
        t = self.totals if self.totals["steps"] else (self._first or self.totals)
        return t["step_s"], t["images"]

    def close(self) -> None:
        """Close the bar and the file."""
        self.close_bar()
        self._file.close()


def _row_step(line: str) -> int:
    """The step of a ``train.jsonl`` row; a row cut short by a kill counts as after every step."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 2**62


def format_summary(summary: dict[str, Any]) -> str:
    """The human summary printed at the end of ``stallfree train``."""
    theory = summary.get("bubble_theory")
    theory_s = f"{theory:.1%}" if theory is not None else "n/a"
    acc = summary.get("eval_top1")
    books = summary.get("books")
    unit = summary.get("unit", "images")
    headline = _books_lines(summary, books) if books else []
    lines = [*headline,
        f"trained {summary['model']} in {summary['stages']} pipeline ranks x {summary['replicas']} replicas, "
        f"schedule {summary['schedule']}, {summary['microbatches']} micro-batches: {summary['steps']} steps "
        f"in {summary['wall_s']:.1f} s",
        f"  throughput     {summary[f'{unit}_per_s']:10.1f} {unit}/s  (fed by {summary.get('feed', 'stallfree')})",
        *([f"  real tokens    {summary['real_tokens_per_s']:10.1f} tokens/s  ({summary['padding_fraction']:.1%} "
           "of the positions were padding)"] if "real_tokens_per_s" in summary else []),
        f"  final loss     {summary['final_loss']:10.4f}",
        f"  eval top-1     {acc:10.1%}{' (next token)' if unit == 'tokens' else ''}" if acc is not None
        else "  eval top-1            n/a",
        f"  input stall    {summary['input_stall_fraction']:10.1%}  (stage 0 waiting for the Loader / step time)",
        f"  bubble         {summary['bubble_fraction']:10.1%}  measured; theory {theory_s}",
    ]
    if summary.get("balance_source") == "measured" and len(summary["balance"]) > 1:
        split = ",".join(map(str, summary["balance"]))
        lines.insert(len(headline) + 1, f"  split          {split:>10}  layers per stage, measured on this run "
                     f"(timings vary from run to run, and so may the split: --balance {split} repeats it)")
    if summary.get("weight_versions") is not None:  # a schedule without a flush (2bw)
        lines.append(f"  weights        {_listed(summary['weight_versions'])} versions kept per stage at most; "
                     f"staleness {_listed(summary['staleness_steps'])} updates")
    sim = summary.get("predicted")
    if sim:
        c = sim["causes"]
        lines.append(f"  simulated      {sim['bubble']:10.1%}  bubble predicted for this split and schedule (warm-up/"
                     f"cool-down {_pct(c['warmup_cooldown'])}, imbalance {_pct(c['imbalance'])}, communication "
                     f"{_pct(c['communication'])} over {sim['link']}, runtime {_pct(c.get('runtime', 0.0))}); "
                     f"{sim[f'{unit}_per_s']:.1f} {unit}/s predicted")
    if sim and sim.get("books"):
        lines.append(f"  predicted      {_parts(sim['books']['job']['parts'])}  (the simulator's books, no input)")
    predicted = summary.get("plan_prediction")
    if predicted:
        ratio = summary["images_per_s"] / predicted["images_per_s"]
        lines.append(f"  the plan      {predicted['images_per_s']:10.1f} images/s and a {predicted['bubble']:.1%} "
                     f"bubble predicted ({predicted['plan']}); measured {ratio:.2f}x its rate")
    return "\n".join(lines)


_NAMES = {"warmup_cooldown": "warm-up/cool-down", "imbalance": "imbalance", "communication": "communication",
          "runtime": "host runtime", "input": "input", "dp_imbalance": "data-parallel imbalance",
          "padding": "padding"}


def _listed(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


def _parts(parts: dict[str, float]) -> str:
    """The parts the books hold, named: the five of every job, then those that apply (replicas, padding)."""
    return ", ".join(f"{name} {parts.get(key, 0.0):.1%}" for key, name in _NAMES.items()
                     if key in parts or key not in ("dp_imbalance", "padding"))


def _books_lines(summary: dict[str, Any], books: dict[str, Any]) -> list[str]:
    """The books (``summary["books"]``, :mod:`stallfree.stage_runtime.plan.books`): the job's line, then each rank's."""
    job = books["job"]
    where = (f"on this accelerator ({summary['accelerator']})" if summary.get("accelerator")
             else "at its measured compute")
    unit = books.get("unit", "images")
    short = "img" if unit == "images" else "tok"
    lines = [f"the pipeline could do {job[f'could_do_{unit}_per_s']:.0f} {short}/s {where} (rank {job['rank']}'s "
             f"own compute, the slowest rank's); it did {books[f'{unit}_per_s']:.0f}, {job['loss']:.1%} lost: "
             f"{_parts(job['parts'])}"]
    for r in books["ranks"]:
        lines.append(f"  rank {r['rank']}: could do {r[f'could_do_{unit}_per_s']:.0f} {short}/s, lost "
                     f"{r['loss']:.1%}: {_parts(r['parts'])}")
    return lines


def _pct(share: float) -> str:
    """``share`` as a percentage to one decimal, a share that rounds to zero as 0.0% (never -0.0%)."""
    return f"{round(share, 3) + 0.0:.1%}"
