"""The PNG of a simulated step: ranks as rows, each operation a bar, as the zero-bubble paper draws them.

With the step's books (:mod:`.books`) a second panel draws each rank's step as one bar: its compute, then the parts
of its loss (warm-up/cool-down, imbalance, communication, host runtime, input), which add up to the step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .books import PARTS, Books
from .simulate import StepResult

__all__ = ["draw_books", "draw_timeline"]

PART_COLOURS = {"compute": "#4c72b0", "warmup_cooldown": "#c7c7c7", "imbalance": "#dd8452", "communication": "#8172b3",
                "runtime": "#c44e52", "input": "#937860"}
PART_NAMES = {"compute": "compute", "warmup_cooldown": "warm-up/cool-down", "imbalance": "imbalance",
              "communication": "communication", "runtime": "host runtime", "input": "input"}
COLOURS = {"F": "#4c72b0", "B": "#55a868", "I": "#64b5cd", "W": "#e1b12c", "O": "#8c8c8c"}
NAMES = {"F": "forward", "B": "backward", "I": "input gradient", "W": "weight gradient", "O": "optimizer"}


def draw_timeline(result: StepResult, path: str | Path, title: str, books: Books | None = None) -> Path:
    """Draw ``result``'s spans to ``path`` (matplotlib, Agg backend); each bar names its stage and micro-batch.

    With ``books``, a second panel draws each rank's books (see the module docstring).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = len(result.busy_s)
    end = max(result.step_s, max((s.end for s in result.spans), default=0.0)) or 1.0
    scale, unit = (1e3, "ms") if end < 10 else (1.0, "s")
    if books is None:
        fig, ax = plt.subplots(figsize=(12, 0.6 * ranks + 1.6))
    else:
        fig, (ax, panel) = plt.subplots(2, 1, figsize=(12, 1.2 * ranks + 3.2))
        draw_books(panel, books)
    kinds = set()
    for span in result.spans:
        kinds.add(span.op.kind)
        width = (span.end - span.start) * scale
        ax.broken_barh([(span.start * scale, width)], (span.rank - 0.4, 0.8),
                       facecolors=COLOURS[span.op.kind], edgecolor="white", linewidth=0.5)
        if width > end * scale / 60 and span.op.kind != "O":
            ax.text(span.start * scale + width / 2, span.rank, f"{span.op.stage}:{span.op.mb}", ha="center",
                    va="center", fontsize=6, color="white")
    for r, seconds in enumerate(result.optimizer_s):  # the optimizer step after the schedule, per rank
        start = max((s.end for s in result.spans if s.rank == r), default=0.0)
        ax.broken_barh([(start * scale, seconds * scale)], (r - 0.4, 0.8), facecolors="none",
                       edgecolor=COLOURS["O"], hatch="//", linewidth=0.5)
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.set_xlim(0, end * scale)
    ax.set_xlabel(f"{unit} (bars: stage:micro-batch)")
    ax.set_title(title, fontsize=9)
    handles = [Patch(color=COLOURS[k], label=NAMES[k]) for k in "FBIWO" if k in kinds]
    if any(result.optimizer_s):
        handles.append(Patch(facecolor="none", edgecolor=COLOURS["O"], hatch="//", label="optimizer step"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25 if ranks < 4 else -0.12),
              ncol=len(handles), fontsize=7, frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_books(ax: Any, books: Books) -> None:
    """Each rank's step as one bar on ``ax``: compute, then each part of the loss, in percent of the step."""
    from matplotlib.patches import Patch

    ranks = len(books.could_do)
    for r in range(ranks):
        left = 0.0
        for part, share in (("compute", 1 - books.loss[r]), *((p, books.parts[r][p]) for p in PARTS)):
            if share > 0:
                ax.barh(r, share * 100, left=left, color=PART_COLOURS[part], height=0.7)
                left += share * 100
        ax.text(max(101, left + 1), r, f"could do {books.could_do[r]:.0f} img/s, lost {books.loss[r]:.1%}",
                va="center", fontsize=7)
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.invert_yaxis()
    ax.axvline(100, color="black", linewidth=0.5)
    ax.set_xlim(0, 135)
    ax.set_xlabel(f"% of the step (did {books.images_per_s:.0f} img/s); the parts of each rank's loss add up to it")
    shown = [p for p in ("compute", *PARTS) if p == "compute" or any(books.parts[r][p] > 0 for r in range(ranks))]
    ax.legend(handles=[Patch(color=PART_COLOURS[p], label=PART_NAMES[p]) for p in shown], loc="upper center",
              bbox_to_anchor=(0.5, -0.35 if ranks < 4 else -0.2), ncol=len(shown), fontsize=7, frameon=False)
