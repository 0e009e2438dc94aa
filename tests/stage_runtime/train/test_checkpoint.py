from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stallfree.stage_runtime.train import checkpoint as ckpt


def test_round_trip_and_latest_moves_only_with_the_manifest(tmp_path: Path) -> None:
    assert ckpt.latest(tmp_path) is None
    ckpt.save_rank(tmp_path, 5, 0, {"w": torch.arange(3.0), "feed": "{}"})
    assert ckpt.latest(tmp_path) is None  # a rank file alone is not a checkpoint yet
    ckpt.save_meta(tmp_path, 5, {"step": 5})
    assert ckpt.latest(tmp_path) == 5
    assert torch.equal(ckpt.load_rank(tmp_path, 5, 0)["w"], torch.arange(3.0))
    assert not list(tmp_path.rglob(".*tmp*"))


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        ckpt.save_rank(tmp_path, step, 0, {"step": step})
        ckpt.save_meta(tmp_path, step, {"step": step})
    ckpt.prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000002", "step-00000003"]


def test_missing_rank_names_the_fix(tmp_path: Path) -> None:
    ckpt.save_rank(tmp_path, 1, 0, {})
    with pytest.raises(FileNotFoundError, match="same --stages, --schedule and --dp"):
        ckpt.load_rank(tmp_path, 1, 3)


def test_loading_refuses_arbitrary_objects(tmp_path: Path) -> None:
    ckpt.step_dir(tmp_path, 1).mkdir(parents=True)
    torch.save({"x": object()}, ckpt.step_dir(tmp_path, 1) / "rank-0.pt")
    with pytest.raises(Exception, match="[Ww]eights"):
        ckpt.load_rank(tmp_path, 1, 0)
