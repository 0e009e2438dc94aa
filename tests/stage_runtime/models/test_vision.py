"""``vlm_tiny``'s vision stem (issue 47, item 5): a patch embedding whose outputs replace the token embeddings at the
image tokens' positions, image after image in ``pixel_values``' order, on packed rows and across a stage cut."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stallfree.stage_runtime.models.gpt import IGNORE_INDEX, row_documents
from stallfree.stage_runtime.models.partition import LayerCost, plan, split
from stallfree.stage_runtime.models.tasks import ImageTextModeling, make_task
from stallfree.stage_runtime.models.vision import VisionTokenEmbedding, image_text_input, vlm_tiny

ID, P, SIDE, VOCAB = 50, 4, 8, 50  # an image of 8x8 pixels is (8 / 4)**2 = 4 tokens of id 50 (outside the text's)


def _batch() -> dict[str, torch.Tensor]:
    """Two packed rows of 12: row 0 an image document (4 image tokens + 3 words) and a text one; row 1 two image
    documents, the second a piece (positions continue), then padding. Three images, in the order their tokens come."""
    ids = torch.tensor([[ID, ID, ID, ID, 5, 6, 7, 8, 9, 10, 11, 12],
                        [ID, ID, ID, ID, 13, ID, ID, ID, ID, 14, 0, 0]])
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 0, 1]])
    documents = torch.tensor([[3, 3, 3, 3, 3, 3, 3, 8, 8, 8, 8, 8], [1, 1, 1, 1, 1, 6, 6, 6, 6, 6, -1, -1]])
    labels = ids.clone()
    labels[ids == ID] = IGNORE_INDEX
    labels[documents < 0] = IGNORE_INDEX
    g = torch.Generator().manual_seed(0)
    return {"input_ids": ids, "position_ids": positions, "document_index": documents, "labels": labels,
            "pixel_values": torch.randn(3, 3, SIDE, SIDE, generator=g),
            "image_document_index": torch.tensor([3, 1, 6])}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_image_positions_take_the_patch_embedding_of_their_image_in_order(device: str) -> None:
    batch = {k: v.to(device) for k, v in _batch().items()}  # the Loader's device="cuda" batches: built there
    torch.manual_seed(0)
    stem = VisionTokenEmbedding(VOCAB, 16, 64, P).to(device)
    x = image_text_input(batch["input_ids"], batch["position_ids"], batch["document_index"], batch["pixel_values"],
                         ID, P)
    out = stem(x)  # (B, S, D + 1)
    conv = stem.patches(batch["pixel_values"]).flatten(2).transpose(1, 2)  # (3 images, 4 patches, D): Conv2d's own
    want_image = conv.reshape(-1, 16)  # image after image, each image's patches in raster order
    image = batch["input_ids"] == ID
    h = out[..., :-1] - stem.positions(batch["position_ids"])
    assert torch.allclose(h[image], want_image, atol=1e-5)
    assert torch.allclose(h[~image], stem.tokens(batch["input_ids"][~image]), atol=1e-6)
    assert torch.equal(out[..., -1], row_documents(batch["document_index"]).float())  # the documents, for the mask


def test_the_model_split_in_two_computes_the_whole_on_packed_image_text_rows() -> None:
    torch.manual_seed(0)
    model = vlm_tiny(VOCAB, d_model=16, layers=2, heads=2, max_positions=64, patch=P).eval()
    task = make_task("tokens", image_size=SIDE, seq_len=12, outputs=VOCAB, patch=P)
    assert isinstance(task, ImageTextModeling) and task.image_token_id == ID and task.image_tokens == 4
    batch = task.batch(_batch())
    assert batch.samples == 22 and torch.equal(batch.targets, _batch()["labels"])
    first, second = split(list(model), plan(list(model), 2, costs=[LayerCost(1.0, 0, 0)] * len(model)).balance)
    with torch.no_grad():
        whole = model(batch.inputs)
        assert whole.shape == (2, 12, VOCAB)
        assert torch.allclose(second(first(batch.inputs)), whole, atol=1e-6)
        # a row's output depends on its own images alone: the rows of a micro-batch are independent
        assert torch.allclose(model(batch.inputs[1:]), whole[1:], atol=1e-6)
        # and a document attends to its own image only: changing row 1's second image leaves its first document
        other = _batch()
        other["pixel_values"][2] += 1.0
        changed = model(task.batch(other).inputs)
    assert torch.allclose(changed[1, :5], whole[1, :5], atol=1e-6) and not torch.allclose(changed[1, 5:10],
                                                                                           whole[1, 5:10])
    loss = task.loss(model(batch.inputs), batch.targets)
    loss.backward()
    assert model[0].patches.weight.grad is not None and model[0].patches.weight.grad.abs().sum() > 0


def test_the_tasks_example_is_valid_stage_0_input_on_any_device() -> None:
    task = make_task("tokens", image_size=SIDE, seq_len=12, outputs=VOCAB, patch=P)
    model = vlm_tiny(VOCAB, d_model=16, layers=1, heads=2, max_positions=64, patch=P)
    x = task.example(3)
    assert x.shape == task.example(3, "meta").shape == (3, 12, 3 + 3 * P * P + 1)
    assert int((x[..., 2] > 0.5).sum()) == 3 * 4 and model(x).shape == (3, 12, VOCAB)
    assert task.work(x) > 0 and task.passed_on(x) is not None


def test_a_batch_whose_images_do_not_match_its_image_tokens_is_refused_with_the_fix() -> None:
    batch = _batch()
    task = make_task("tokens", image_size=SIDE, seq_len=12, outputs=VOCAB, patch=P)
    batch["pixel_values"] = batch["pixel_values"][:2]
    with pytest.raises(ValueError, match=r"the batch has 12 image positions \(input_ids == 50\) but its 2 images of "
                       r"8x8 pixels make 8 patches of 4x4; give the Loader Packing\(image_tokens=4\)"):
        task.batch(batch)
    batch = _batch()
    batch["pixel_values"] = nn.functional.interpolate(batch["pixel_values"], size=(10, 10))
    with pytest.raises(ValueError, match=r"images of 10x10 pixels do not cut into patches of 4x4"):
        task.batch(batch)
    del batch["pixel_values"]
    with pytest.raises(ValueError, match=r"a batch without pixel_values reached a vision model"):
        task.batch(batch)
