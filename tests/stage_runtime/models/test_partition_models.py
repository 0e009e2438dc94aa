"""Every bundled model is a flat sequence of layers that the partitioner can cut anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stallfree.stage_runtime.config.train_config import TOKEN_MODELS, VISION_MODELS
from stallfree.stage_runtime.models.partition import LayerCost, plan, split
from stallfree.stage_runtime.models.tasks import make_task
from stallfree.stage_runtime.models.zoo import MODELS, build_model

SIZES = {"resnet18": 32, "resnet50": 32, "vit_small": 16}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bundled_model_split_in_two_computes_the_whole(name: str) -> None:
    size = SIZES.get(name, 16)
    model = build_model(name, num_classes=5, image_size=size).eval()
    # stage 0's input: images, or a token model's packed rows of 16 tokens (issue 46), whose documents cross the cut
    # (issue 47: a vision model's rows open with an image of (16 / 8)**2 = 4 patches)
    task = make_task("tokens" if name in TOKEN_MODELS else "images", image_size=size, seq_len=16, outputs=5,
                     patch=8 if name in VISION_MODELS else None)
    x = task.example(2)
    partition = plan(list(model), 2, costs=[LayerCost(1.0, 0, 0)] * len(model))  # measuring: test_partition
    first, second = split(list(model), partition.balance)
    with torch.no_grad():
        assert torch.allclose(second(first(x)), model(x), atol=1e-6)
        assert model(x).shape == ((2, 16, 5) if name in TOKEN_MODELS else (2, 5))


def test_user_factories_by_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_models.py").write_text(
        "from torch import nn\n"
        "def layers(num_classes, image_size):\n"
        "    return [nn.Flatten(), nn.Linear(3 * image_size * image_size, num_classes)]\n"
        "def plain():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(12, 2))\n"
        "def not_layers(num_classes, image_size):\n"
        "    return nn.Linear(2, 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert len(build_model("my_models:layers", 4, 2)) == 2
    assert len(build_model("my_models:plain", 4, 2)) == 2
    with pytest.raises(ValueError, match="returned Linear"):
        build_model("my_models:not_layers", 4, 2)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        build_model("nope", 3, 8)
