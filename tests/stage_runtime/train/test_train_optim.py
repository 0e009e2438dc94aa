"""``stallfree train`` for a user's model (issue 35, item 8): the augmentation (``--transform``), the optimizer
(``--optimizer``, ``--lr``, ``--weight-decay``) and the learning-rate schedule (``--lr-schedule``,
``--warmup-steps``) take effect, with their defaults stated, and a bad value fails before any process starts."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest
import torch

from stallfree.cli import build_parser, main
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.train import checkpoint
from stallfree.stage_runtime.train.augment import parse_spec, training_transform
from stallfree.stage_runtime.train.optim import build_optimizer, build_scheduler, lr_factor


@pytest.mark.parametrize(("step", "factor"), [
    (0, 1 / 4), (1, 2 / 4), (3, 1.0),  # linear warm-up over 4 steps, at the peak on the last of them
    (4, 1.0),  # the cosine starts at the peak
    (7, 0.5 * (1 + math.cos(math.pi * 3 / 6))),  # half-way through the 6 steps after the warm-up
    (9, 0.5 * (1 + math.cos(math.pi * 5 / 6))),  # the last step of 10
])
def test_cosine_with_warmup(step: int, factor: float) -> None:
    assert lr_factor(step, total=10, warmup=4, schedule="cosine") == pytest.approx(factor)


def test_constant_is_the_default_and_stays_at_lr() -> None:
    config = TrainConfig.from_flags()
    o = config.optimizer
    assert (o.name, o.lr, o.lr_schedule, o.warmup_steps) == ("sgd", 0.01, "constant", 0)
    assert [lr_factor(s, 10, 0, "constant") for s in (0, 5, 9)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(("name", "kind"), [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW)])
def test_the_optimizer_and_the_rate_each_step_uses(name: str, kind: type) -> None:
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = build_optimizer([weight], name, lr=0.1, momentum=0.9, weight_decay=0.01)
    assert type(optimizer) is kind and optimizer.param_groups[0]["weight_decay"] == 0.01
    scheduler = build_scheduler(optimizer, total=6, warmup=2, schedule="cosine")
    used = []
    for _ in range(6):
        used.append(optimizer.param_groups[0]["lr"])
        weight.sum().backward()
        optimizer.step()
        scheduler.step()
    assert used == pytest.approx([0.1 * lr_factor(s, 6, 2, "cosine") for s in range(6)])
    assert used[:3] == pytest.approx([0.05, 0.1, 0.1])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"optimizer": "adam"}, r"optimizer must be one of sgd, adamw, got 'adam'"),
    ({"lr_schedule": "step"}, r"lr_schedule must be one of constant, cosine, got 'step'"),
    ({"lr": 0.0}, r"--lr must be a finite number > 0, got 0.0"),
    ({"warmup_steps": -1}, r"--warmup-steps must be a finite number >= 0, got -1"),
    ({"transform": "RandomHorizontalFlip()"}, r"--synthetic generates tensors: drop --transform"),
    ({"transform": "RandomHorizontalFlip()", "data": "d", "feed": "torch"}, r"--feed torch uses the baseline's own"),
])
def test_bad_settings_are_refused_when_the_config_is_built(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_flags(**kwargs)  # type: ignore[arg-type]


def test_the_help_states_the_defaults() -> None:
    text = next(a for a in build_parser()._actions if a.dest == "command").choices["train"].format_help()
    for default in ("(default sgd)", "(default 0.01)", "(default constant)", "(default 0)",
                    "default: RandomResizedCrop(image-size), RandomHorizontalFlip(), Normalize(ImageNet mean"):
        assert default in " ".join(text.split()), default


def test_a_torchvision_style_spec_builds_stallfrees_steps() -> None:
    from stallfree.transforms import ColorJitter, Normalize, RandomHorizontalFlip, RandomResizedCrop

    steps = parse_spec("RandomResizedCrop(24, scale=(0.5, 1.0)), RandomHorizontalFlip(p=0.25), ColorJitter(0.4), "
                       "Normalize()")
    assert [type(s) for s in steps] == [RandomResizedCrop, RandomHorizontalFlip, ColorJitter, Normalize]
    assert steps[0] == RandomResizedCrop(24, scale=(0.5, 1.0)) and steps[1] == RandomHorizontalFlip(p=0.25)
    # as torchvision users write it
    again = parse_spec("T.Compose([T.RandomResizedCrop(24, scale=(0.5, 1.0)), T.RandomHorizontalFlip(p=0.25), "
                       "T.ColorJitter(0.4), T.Normalize()])")
    assert again == steps


@pytest.mark.parametrize(("spec", "message"), [
    ("RandomResizedCrop(24", r"does not parse .*write steps like"),
    ("RandomResizedCrop(24), Blur(3)", r"'Blur\(3\)' is not a step stallfree knows; use one of .*RandomResizedCrop"),
    ("RandomResizedCrop(size)", r"'RandomResizedCrop\(size\)': arguments must be literals"),
    ("RandomResizedCrop(24, scale=(1.0, 0.5))", r"'RandomResizedCrop\(24, scale=\(1.0, 0.5\)\)': .*scale"),
    ("__import__('os').system('true')", r"is not a step stallfree knows"),
])
def test_a_bad_spec_names_the_item(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_a_factory_is_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_augment.py").write_text(textwrap.dedent("""
        from stallfree.transforms import CenterCrop, Normalize
        def train_transform():
            return [CenterCrop(8), Normalize()]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    from stallfree.transforms import CenterCrop, Normalize

    assert training_transform("my_augment:train_transform", 32) == [CenterCrop(8), Normalize()]
    with pytest.raises(ValueError, match=r"--transform 'my_augment:nothing': cannot import 'nothing'"):
        training_transform("my_augment:nothing", 32)


def test_a_transform_the_loader_cannot_run_fails_before_any_process(
        image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", str(image_folder), "--transform", "RandomResizedCrop(8), Blur()", "--stages", "1",
                 "--model", "mlp", "--image-size", "8", "--batch-size", "4", "--max-steps", "1", "--no-progress",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "'Blur()' is not a step stallfree knows" in err


@pytest.mark.slow
def test_they_take_effect_in_a_run(image_folder: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", str(image_folder), "--stages", "1", "--model", "mlp", "--image-size", "8",
                 "--batch-size", "4", "--microbatches", "1", "--max-steps", "4", "--no-progress", "--timeout", "120",
                 "--transform", "RandomResizedCrop(8, scale=(0.5, 1.0)), RandomHorizontalFlip(), Normalize()",
                 "--optimizer", "adamw", "--lr", "0.002", "--weight-decay", "0.05", "--lr-schedule", "cosine",
                 "--warmup-steps", "2", "--out", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "train.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx([0.002 * lr_factor(s, 4, 2, "cosine") for s in range(4)])
    assert [r["lr"] for r in rows][:3] == pytest.approx([0.001, 0.002, 0.002])
    state = checkpoint.load_rank(run / "checkpoints", 4, 0)
    group = state["optimizer"]["param_groups"][0]
    assert "betas" in group and group["weight_decay"] == 0.05  # AdamW's state, not SGD's
    assert state["scheduler"]["last_epoch"] == 4
    summary = json.loads((run / "summary.json").read_text())
    assert summary["config"]["optimizer"] == "adamw" and summary["config"]["lr_schedule"] == "cosine"
    assert summary["config"]["transform"].startswith("RandomResizedCrop(8")
