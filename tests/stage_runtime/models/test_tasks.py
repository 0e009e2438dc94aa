"""What a token micro-batch costs the simulated device (issue 48): its documents' cost, read at any stage's input."""

from __future__ import annotations

import pytest
import torch

from stallfree.core.cost import Cost
from stallfree.stage_runtime.models.gpt import gpt_tiny
from stallfree.stage_runtime.models.tasks import ImageClassification, LanguageModeling
from stallfree.stage_runtime.stage import SimulatedCompute

S = 8


def _micro_batch() -> torch.Tensor:
    """Stage 0's input: row 0 holds documents of 3 and 5 tokens; row 1 a piece of 8 of document 7; row 2 its last
    2 tokens (a piece of its own length, in another row), then padding."""
    documents = torch.tensor([[5, 5, 5, 9, 9, 9, 9, 9], [7] * 8, [7, 7, -1, -1, -1, -1, -1, -1]])
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4], list(range(8)), [8, 9, 0, 1, 2, 3, 4, 5]])
    return torch.stack([torch.ones_like(documents), positions, documents], dim=1)


def test_a_token_micro_batchs_work_is_its_documents_cost_at_every_stage() -> None:
    task = LanguageModeling(S, 16, Cost.attention(4))
    # (3 + 5 + 8 + 2) + (9 + 25 + 64 + 4) / 4, and the 6 padding slots their linear part alone (no attention)
    want = Cost(1.0, 0.25).lengths([3, 5, 8, 2]) + 6
    x = _micro_batch()
    assert task.work(x) == pytest.approx(want)
    model = gpt_tiny(16, d_model=8, layers=1, heads=2)
    hidden = model[0](x)  # the real stage boundary: hidden states and the documents' channel
    assert task.work(hidden) == pytest.approx(want) and task.work(model[1](hidden)) == pytest.approx(want)
    # A simulated stage's stand-in computes nothing but hands the documents on: the next stage reads the same work.
    first = SimulatedCompute(model[0], hidden.shape[1:], work=task.work, carry=task.passed_on)
    middle = SimulatedCompute(model[1], hidden.shape[1:], work=task.work, carry=task.passed_on)
    out = middle(first(x))
    assert first.work == pytest.approx(want) and middle.work == pytest.approx(want)
    assert out.shape == hidden.shape and task.work(out) == pytest.approx(want)


def test_the_default_cost_makes_attention_over_a_full_row_as_costly_as_the_linear_part() -> None:
    one_row = _micro_batch()[1:2]  # a piece of S tokens
    assert LanguageModeling(S, 16).work(one_row) == pytest.approx(2 * S)


def test_an_image_micro_batchs_work_is_its_images() -> None:
    assert ImageClassification(8).work(torch.zeros(5, 3, 8, 8)) == 5.0
    assert ImageClassification(8).passed_on(torch.zeros(5, 3, 8, 8)) is None
