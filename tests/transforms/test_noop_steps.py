"""Steps that do nothing (torchvision's no-ops) run through a real Loader; inputs fed equal inputs declared.

Regression: ``Loader(folder, transform=[ColorJitter(), ...])`` constructed, then its first batch raised
``KeyError: 'Could not find an input operator with name "0.order"'``: the step's build returned the image, so DALI
pruned its parameter inputs, which were still drawn and fed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stallfree import Loader
from stallfree.transforms import (
    CenterCrop,
    ColorJitter,
    Normalize,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomSolarize,
    Transform,
)
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size

NO_OPS = [
    ColorJitter(),
    ColorJitter(brightness=0, contrast=0),
    ColorJitter(brightness=(1, 1)),
    RandomGrayscale(p=0),
    RandomErasing(p=0),
    RandomSolarize(128, p=0),
    RandomHorizontalFlip(p=0),
]


def first_batch(folder: Path, spec: list[Any]) -> torch.Tensor:
    images, _ = next(iter(Loader(folder, batch_size=4, transform=spec, shuffle=False, num_threads=1, seed=3)))
    return images


@pytest.mark.parametrize("step", NO_OPS, ids=repr)
def test_a_no_op_step_through_a_loader_gives_the_spec_without_it(image_folder: Path, step: Transform) -> None:
    without = first_batch(image_folder, [CenterCrop(16), Normalize()])
    assert torch.equal(first_batch(image_folder, [CenterCrop(16), step, Normalize()]), without)
    assert torch.equal(first_batch(image_folder, [step, CenterCrop(16), Normalize()]), without)


@pytest.mark.parametrize("step", NO_OPS, ids=repr)
def test_a_no_op_step_draws_and_feeds_nothing(step: Transform) -> None:
    compiled = CompiledTransforms([step, CenterCrop(8)])
    assert step.is_identity()
    assert compiled.steps == [CenterCrop(8)] and compiled.param_inputs == {"0.anchor": np.int32}
    assert list(compiled.draw([SampleRandom(0, 0, 1)], [(10, 12)])) == ["0.anchor"]


@pytest.mark.parametrize("step", [ColorJitter(brightness=0.2), RandomGrayscale(p=0.1), RandomHorizontalFlip(p=1)])
def test_a_step_that_acts_is_kept(step: Transform) -> None:
    assert not step.is_identity()
    assert len(CompiledTransforms([step, CenterCrop(8)]).steps) == 2


@dataclass(frozen=True)
class _UnreadGain(Transform):
    """A user step that declares an input its build never reads: the mismatch the compiler refuses."""

    params = {"gain": np.float32}

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        return {"gain": np.array([rng.random()], np.float32)}, size

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        return image, state


def test_a_step_whose_build_leaves_a_declared_input_unread_is_named(image_folder: Path) -> None:
    with pytest.raises(TypeError, match=r"_UnreadGain\(\) declares the per-sample inputs \['gain'\].*identity\(\)"):
        first_batch(image_folder, [_UnreadGain(), CenterCrop(16)])
