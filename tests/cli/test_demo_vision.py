"""``stallfree demo --vision`` (issue 47, item 5): generated captions, ingested as image-text shards, and vlm_tiny
trained on the Loader's image-text packs in 2 stages, in one command; its loss falls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main


@pytest.mark.slow
def test_the_vision_demo_trains_a_vision_language_model_end_to_end_and_its_loss_falls(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--vision", "--images", "128", "--epochs", "3", "--out", str(out), "--keep-data",
                 "--no-progress"]) == 0
    result = json.loads((out / "demo-vision.json").read_text())
    assert result["ingest"]["train"]["images"] == 128  # one image per caption, every row ingested
    assert result["loss_last"] < result["loss_first"] - 1.0, result  # from log(54) = 4.0
    assert result["train"]["unit"] == "tokens" and result["train"]["eval_top1"] is not None
    assert (out / "data" / "shards" / "train" / "manifest.json").is_file()
    text = capsys.readouterr().out
    assert "trained vlm_tiny in 2 pipeline ranks" in text and "loss " in text and "without their images" in text
