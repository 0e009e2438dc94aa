"""``LoaderProfile.save()``'s ``profile.png``: what :func:`stallfree.profile` measured on a user's own loop.

Apart from :mod:`.chart` (the five-phase profile's chart), which reads :mod:`.report`, itself built on :mod:`.loop`:
this one is drawn from :mod:`.loop` and imports nothing of the profiler back.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

__all__ = ["draw_loader_profile"]


def draw_loader_profile(result: dict[str, Any], waits_s: list[float], path: str | Path) -> Path:
    """Draw :func:`stallfree.profile`'s result (``LoaderProfile.to_dict()``) and its per-batch waits to ``path``.

    Top: each stage's time per batch (per batch of its own, parallel workers counted once) beside the step's; a
    stage is red only when the loop waited for input and the stage is slower than the step. Bottom: the wait of
    every timed batch.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step_ms = 1e3 * result["step_s"]["mean"]
    stages = {name: 1e3 * t for name, t in result["stage_time_per_batch_s"].items()}
    input_bound = result["verdict"] not in ("not input-bound", "no step given")
    fill = ["tab:red" if input_bound and t > step_ms else "tab:blue" for t in stages.values()]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), gridspec_kw={"height_ratios": [1.2, 1]})
    top.barh([*stages, "step (mean)", "wait (mean)"], [*stages.values(), step_ms, 1e3 * result["wait_s"]["mean"]],
             color=[*fill, "tab:grey", "tab:orange"])
    top.invert_yaxis()
    top.set_xlabel("ms per batch")
    head = (f"{result['batches']} batches, {result['samples_per_s']:.0f} samples/s: {result['verdict']} (waited "
            f"{result['stall_share']:.1%} of step time), bottleneck: {result['bottleneck']}")
    top.set_title(textwrap.fill(head, 100), fontsize=9, loc="left")
    bottom.plot(range(len(waits_s)), [1e3 * w for w in waits_s], color="tab:orange", marker=".")
    bottom.set_xlabel("timed batch")
    bottom.set_ylabel("wait (ms)")
    bottom.set_title("the loop's wait for each batch")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
