"""``vlm_tiny``: :mod:`.gpt`'s decoder with a minimal vision stem, trained on packed image-text sequences.

The stem is a patch embedding (a ``Conv2d`` of kernel and stride ``P``, as ViT's and LLaVA's vision towers begin):
an image of ``H x W`` pixels becomes ``(H/P) x (W/P)`` tokens, its patches in raster order, and those replace the
token embeddings at the positions where ``input_ids == image_token_id``, image after image in ``pixel_values``'
order (the Loader's: the order their tokens appear in the batch, row-major). Position embeddings are added to both.

The model stays a flat ``nn.Sequential`` whose layers each take one tensor, so the partitioner cuts it anywhere
and a pipeline schedule splits stage 0's input by rows. So the stem's input is made per row, once, by
:func:`image_text_input`: each position carries its token id, its position, a flag saying it is an image token,
that token's patch pixels (``C x P x P`` values, zero on text) and its row-local document id last::

    (B, S, 3 + C*P*P + 1) float32     VisionTokenEmbedding                           (B, S, D + 1)
    [id, position, image?,       ─►   text: token embedding      + position    ─►   [hidden | document]  ─► blocks
     patch pixels..., document]       image: Conv2d on its patch   embedding

Applying the convolution to one patch is a matrix product with its weight flattened (``weight.flatten(1)``, the
order ``F.unfold`` lays a patch out in), which is what the stem does; a test checks it equals ``Conv2d`` on the
images. The stem lives in the first layer, so in stage 0 under any ``--stages``. The document channel stays last,
as at every later stage boundary (:func:`~.gpt.boundary_documents` reads it from either).
"""

from __future__ import annotations

import torch
from torch import nn

from stallfree.stage_runtime.models.gpt import check_range, decoder, row_documents

__all__ = ["VisionTokenEmbedding", "image_text_input", "input_width", "vlm_tiny"]


def input_width(patch: int, channels: int = 3) -> int:
    """Channels per position of stage 0's input: id, position, image flag, ``channels * patch**2`` pixels, document."""
    return 3 + channels * patch * patch + 1


def image_text_input(input_ids: torch.Tensor, position_ids: torch.Tensor, document_index: torch.Tensor,
                     pixel_values: torch.Tensor, image_token_id: int, patch: int) -> torch.Tensor:
    """Stage 0's input (B, S, :func:`input_width`) float32 from a packed image-text batch's fields.

    ``input_ids``, ``position_ids``, ``document_index``: (B, S) int; ``pixel_values``: (N_images, C, H, W), in the
    order their tokens appear (row-major). Each image's ``(H/P) * (W/P)`` patches go, in raster order, to the next
    positions whose id is ``image_token_id``; a text position's pixels are 0 and its id is kept.

    Raises:
        ValueError: the images' sides are not multiples of ``patch``, or their patches do not match the batch's
            image positions in number (the Loader's ``image_tokens`` must be ``(H/P) * (W/P)``).
    """
    n, c, h, w = pixel_values.shape
    if h % patch or w % patch:
        raise ValueError(f"vlm_tiny: images of {h}x{w} pixels do not cut into patches of {patch}x{patch}; resize "
                         f"them to a multiple of {patch} (--image-size) or choose another --patch")
    image = input_ids == image_token_id  # (B, S)
    tokens = (h // patch) * (w // patch)
    if int(image.sum()) != n * tokens:
        raise ValueError(f"vlm_tiny: the batch has {int(image.sum())} image positions (input_ids == "
                         f"{image_token_id}) but its {n} images of {h}x{w} pixels make {n * tokens} patches of {patch}x"
                         f"{patch}; give the Loader Packing(image_tokens={tokens})")
    # (N, C*P*P, L) -> (N * L, C*P*P): each image's patches in raster order, each patch laid out as the weight is
    patches = nn.functional.unfold(pixel_values.float(), patch, stride=patch)
    patches = patches.transpose(1, 2).reshape(-1, c * patch ** 2)
    b, s = input_ids.shape
    x = torch.zeros(b, s, input_width(patch, c), dtype=torch.float32, device=input_ids.device)
    x[..., 0] = input_ids.masked_fill(image, 0)
    x[..., 1] = position_ids
    x[..., 2] = image
    x[image, 3:-1] = patches.to(x.device)  # boolean indexing walks the positions row-major: the images' order
    x[..., -1] = row_documents(document_index)  # row-local ids, at most 2 S: exact in float32
    return x


class VisionTokenEmbedding(nn.Module):
    """(B, S, 3 + C*P*P + 1) float (:func:`image_text_input`) -> (B, S, D + 1): text and image embeddings, documents.

    ``patches`` is the stem: a ``Conv2d(channels, d_model, patch, stride=patch)``, applied to each image position's
    patch.
    """

    def __init__(self, vocab_size: int, d_model: int, max_positions: int, patch: int, channels: int = 3):
        super().__init__()
        self.vocab_size, self.max_positions, self.patch, self.channels = vocab_size, max_positions, patch, channels
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_positions, d_model)
        self.patches = nn.Conv2d(channels, d_model, patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = input_width(self.patch, self.channels)
        if x.shape[-1] != width:
            raise ValueError(f"vlm_tiny: stage 0 takes {width} channels per position (patch {self.patch}, "
                             f"{self.channels} colour channels), got {x.shape[-1]}")
        ids, positions, image = x[..., 0].long(), x[..., 1].long(), x[..., 2] > 0.5  # each (B, S)
        if not x.is_meta:  # the stage shapes are inferred on meta tensors, which hold no values
            check_range("input_ids", ids, self.vocab_size, "vocab_size (--vocab-size)")
            check_range("position_ids", positions, self.max_positions,
                        "max_positions (a document's split pieces continue its positions)")
        text = self.tokens(ids)  # (B, S, D)
        seen = nn.functional.linear(x[..., 3:-1], self.patches.weight.flatten(1), self.patches.bias)  # (B, S, D)
        h = torch.where(image.unsqueeze(-1), seen, text) + self.positions(positions)
        return torch.cat([h, x[..., -1:].to(h.dtype)], dim=-1)


def vlm_tiny(vocab_size: int = 256, d_model: int = 64, layers: int = 2, heads: int = 4, max_positions: int = 2048,
             mlp_ratio: int = 4, patch: int = 8, channels: int = 3) -> nn.Sequential:
    """:func:`~.gpt.gpt_tiny` with the vision stem (:class:`VisionTokenEmbedding`) in its first layer.

    ``vocab_size`` is the text's: the image token's id may lie outside it (its positions take the stem's output).
    """
    for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("layers", layers), ("heads", heads),
                        ("max_positions", max_positions), ("mlp_ratio", mlp_ratio), ("patch", patch),
                        ("channels", channels)):
        if value < 1:
            raise ValueError(f"vlm_tiny: {name} must be >= 1, got {value}")
    return decoder(VisionTokenEmbedding(vocab_size, d_model, max_positions, patch, channels), vocab_size, d_model,
                   layers, heads, mlp_ratio)
