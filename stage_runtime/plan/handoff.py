"""``stallfree train --plan plan.json``: the best configuration of a plan as the trainer's settings.

``plan.json`` (written by ``stallfree plan``, format ``stallfree-plan/1``) keeps its best configuration's
``stallfree train`` flags first in ``best``; this module reads them back, checks them, and keeps the prediction so
that the training summary can print it beside what was measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["PLAN_FORMAT", "train_settings"]

PLAN_FORMAT = "stallfree-plan/1"
_FLAGS = ("schedule", "stages", "virtual_stages", "microbatches", "balance", "batch_size")


def train_settings(path: str | Path) -> dict[str, Any]:
    """``TrainConfig`` fields from ``path``'s best plan: model, image size, schedule, split, micro-batches, batch.

    ``plan_prediction`` holds what the plan predicted (step seconds, images per second, bubble share).

    Raises:
        ValueError: the file is not a readable plan, naming it and what is wrong.
    """
    path = Path(path)
    try:
        plan = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable plan.json ({err})") from err
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise ValueError(f"{path}: not a plan of format {PLAN_FORMAT} (write one with `stallfree plan`)")
    best = plan.get("best")
    missing = [k for k in _FLAGS if not isinstance(best, dict) or k not in best]
    if missing:
        raise ValueError(f"{path}: the best plan lacks {', '.join(missing)}")
    assert isinstance(best, dict)
    settings: dict[str, Any] = {k: best[k] for k in _FLAGS}
    settings["balance"] = tuple(int(b) for b in best["balance"])
    settings["image_size"] = int(plan["image_size"])
    if plan.get("costs", {}).get("source") == "measured":  # from --costs, the costs describe other hardware
        settings["model"] = str(plan["model"])
    settings["plan_prediction"] = {"step_s": float(best["step_s"]), "images_per_s": float(best["images_per_s"]),
                                   "bubble": float(best["bubble"]["total"]), "plan": str(path)}
    return settings
