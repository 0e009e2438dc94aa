"""The demo's training run, as ``stallfree demo`` calls it: 2 stages, 1F1B, the real Loader, well above chance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.ingest.synthetic import make_image_folder
from stallfree.stage_runtime.jobs import train
from stallfree.stage_runtime.train.trainer import demo_config

pytestmark = pytest.mark.slow  # the demo's training


def test_demo_training_beats_chance(tmp_path: Path) -> None:
    train_dir = make_image_folder(tmp_path / "train", num_classes=4, per_class=150, size=(48, 48), seed=0)
    eval_dir = make_image_folder(tmp_path / "val", num_classes=4, per_class=25, size=(48, 48), seed=1)
    summary = train(demo_config(str(train_dir), str(eval_dir), str(tmp_path / "run"), progress=False))
    assert summary["eval_top1"] > 0.5, summary  # chance is 0.25
    assert summary["schedule"] == "1f1b" and summary["stages"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "train.jsonl").read_text().splitlines()]
    assert sum("eval_top1" in r for r in rows) == 6
    assert all(0.0 <= r["input_stall"] <= 1.0 for r in rows if "loss" in r)
