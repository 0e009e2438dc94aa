"""``plan.json``, written and read: the layout of a plan, and the best configuration as the trainer's settings.

``plan.json`` (written by ``stallfree plan`` and :meth:`~.plan.PlanResult.write`, format ``stallfree-plan/1``)
keeps its best configuration's ``stallfree train`` flags first in ``best``; ``stallfree train --plan`` reads them
back (:func:`train_settings`), checks them, and keeps the prediction so that the training summary can print it
beside what was measured.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import PlanResult

__all__ = ["PLAN_FORMAT", "plan_document", "train_settings"]

PLAN_FORMAT = "stallfree-plan/1"
_FLAGS = ("schedule", "stages", "virtual_stages", "microbatches", "balance", "batch_size")


def plan_document(result: PlanResult) -> dict[str, Any]:
    """``result`` as ``plan.json`` holds it.

    The inputs, the costs' source, ``best`` (its first keys are the train flags :func:`train_settings` reads),
    every configuration in rank order, those torch refused with the reason, and the asynchronous schedules.
    """
    network = result.network
    return {"format": PLAN_FORMAT, "model": result.model, "image_size": result.image_size,
            "classes": result.classes, "batch_size": result.batch_size, "devices": network.devices,
            "sites": network.sites, "link": network.link.describe(), "cross_link": network.cross_link.describe(),
            "memory_per_device": result.memory_limit, "costs": result.costs,
            "cores": None if result.cores is None else asdict(result.cores),
            "optimizer_s": result.optimizer_s, "calibration": result.calibration, "pilots": result.pilots,
            "best": result.best.to_dict(), "train_command": result.train_command,
            "candidates": [c.to_dict() for c in result.candidates], "skipped": list(result.skipped),
            "asynchronous": [a.to_dict() for a in result.asynchronous]}


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
