"""The PNG of a simulated step: ranks as rows, each operation a bar, as the zero-bubble paper draws them."""

from __future__ import annotations

from pathlib import Path

from .simulate import StepResult

__all__ = ["draw_timeline"]

COLOURS = {"F": "#4c72b0", "B": "#55a868", "I": "#64b5cd", "W": "#e1b12c", "O": "#8c8c8c"}
NAMES = {"F": "forward", "B": "backward", "I": "input gradient", "W": "weight gradient", "O": "optimizer"}


def draw_timeline(result: StepResult, path: str | Path, title: str) -> Path:
    """Draw ``result``'s spans to ``path`` (matplotlib, Agg backend); each bar names its stage and micro-batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = len(result.busy_s)
    end = max(result.step_s, max((s.end for s in result.spans), default=0.0)) or 1.0
    scale, unit = (1e3, "ms") if end < 10 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(12, 0.6 * ranks + 1.6))
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
