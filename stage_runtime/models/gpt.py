"""``gpt_tiny``: a small decoder-only transformer trained on packed token sequences, attending within documents only.

The model is a flat ``nn.Sequential`` like the image models (:mod:`.zoo`), so the partitioner cuts it between any two
layers and every layer takes one tensor and returns one::

    (B, 3, S) int64            TokenEmbedding       (B, S, D + 1) float       Block x N       (B, S, D + 1)   LMHead
    [input_ids,          ─►    token + position  ─►  [hidden | document]  ─►  pre-norm  ─►  ...          ─►  (B, S, V)
     position_ids,             embeddings            the last channel:        attention                     logits
     document_index]                                 each token's document    + MLP

The stage boundary carries the hidden states and one more channel: each token's document as a small row-local id
(:func:`row_documents`, at most ``2 * S``, exact in float32), from which every block builds its attention mask. So a
pipeline stage sends one float tensor, as the image models' stages do, and the later blocks know the documents.

Attention is torch's ``scaled_dot_product_attention`` with a boolean block-diagonal causal mask (:func:`document_mask`):
a token attends to the earlier tokens of its own document in its row; a padding token (``document_index`` -1) to
itself alone, so no row of the mask is empty. flex/varlen attention would skip the masked blocks, but flex attention
needs ``torch.compile`` to be fast (and a C++ compiler on CPU) and flash-attention's varlen functions run on CUDA only;
the dense mask runs everywhere, CPU CI included, and costs ``S^2`` booleans per row, nothing at this model's size.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["IGNORE_INDEX", "Block", "LMHead", "TokenEmbedding", "boundary_documents", "check_range", "decoder",
           "document_lengths", "document_mask", "gpt_tiny", "lm_loss", "row_documents"]

IGNORE_INDEX = -100  # Hugging Face's: a label that is never predicted (padding, each document's first token)


def row_documents(document_index: torch.Tensor) -> torch.Tensor:
    """Each token's document as a row-local id: equal ids, same ``document_index``; a padding token's its own.

    ``document_index`` (B, S) holds dataset rows (any int64, -1 on padding); the ids are ranks of the row's distinct
    documents, 1..S, and ``S + 1 + column`` for padding, so they stay exact in float32 for any dataset size.
    """
    s = document_index.shape[1]
    ordered, order = document_index.sort(dim=1)
    new = torch.ones_like(ordered)
    new[:, 1:] = (ordered[:, 1:] != ordered[:, :-1]).to(new.dtype)
    ids = torch.empty_like(ordered).scatter_(1, order, new.cumsum(1))  # (B, S): 1..S, equal within a document
    columns = torch.arange(s, device=document_index.device).expand_as(ids)
    return torch.where(document_index < 0, s + 1 + columns, ids)


def boundary_documents(x: torch.Tensor) -> torch.Tensor:
    """Each token's row-local document id (:func:`row_documents`) from any stage's input (B, S).

    Stage 0 takes ``[input_ids, position_ids, document_index]`` (B, 3, S) int64; every later stage a boundary
    (B, S, D + 1) float whose last channel holds the ids.
    """
    return x[..., -1] if x.is_floating_point() else row_documents(x[:, 2])


def document_lengths(documents: torch.Tensor) -> torch.Tensor:
    """The length of every document segment in ``documents`` (B, S) row-local ids, padding left out (int64).

    Ids 1..S are documents (a split document's piece is a document of its own in its row), above S padding.
    """
    b, s = documents.shape
    ids = documents.to(torch.int64)
    real = ids <= s
    keys = (torch.arange(b, device=ids.device)[:, None] * (s + 1) + ids)[real]
    counts = torch.bincount(keys.cpu(), minlength=1)
    return counts[counts > 0]


def document_mask(documents: torch.Tensor) -> torch.Tensor:
    """(B, 1, S, S) bool, True where query ``i`` may attend to key ``j``: ``j <= i`` and the same document.

    ``documents`` (B, S): :func:`row_documents`' ids (a padding token's is its own, so it attends to itself alone).
    """
    s = documents.shape[1]
    same = documents[:, :, None] == documents[:, None, :]  # (B, S, S)
    causal = torch.ones(s, s, dtype=torch.bool, device=documents.device).tril()
    return (same & causal).unsqueeze(1)


class TokenEmbedding(nn.Module):
    """(B, 3, S) int64 ``[input_ids, position_ids, document_index]`` -> (B, S, D + 1): embeddings and documents."""

    def __init__(self, vocab_size: int, d_model: int, max_positions: int):
        super().__init__()
        self.vocab_size, self.max_positions = vocab_size, max_positions
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(max_positions, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, positions, document_index = x.unbind(1)  # each (B, S)
        if not x.is_meta:  # the stage shapes are inferred on meta tensors, which hold no values
            check_range("input_ids", ids, self.vocab_size, "vocab_size (--vocab-size)")
            check_range("position_ids", positions, self.max_positions,
                         "max_positions (a document's split pieces continue its positions)")
        h = self.tokens(ids) + self.positions(positions)  # (B, S, D)
        return torch.cat([h, row_documents(document_index).unsqueeze(-1).to(h.dtype)], dim=-1)


def check_range(name: str, values: torch.Tensor, high: int, what: str) -> None:
    """Refuse ``values`` outside ``[0, high)``, naming them and what to raise (``what``)."""
    low, top = int(values.min()), int(values.max())
    if low < 0 or top >= high:
        raise ValueError(f"gpt_tiny: {name} must be in [0, {high}), got values from {low} to {top}; raise {what}")


class Block(nn.Module):
    """A pre-norm transformer block: ``h + attention(norm(h))``, then ``h + mlp(norm(h))``, on (B, S, D + 1)."""

    def __init__(self, d_model: int, heads: int, mlp_ratio: int = 4):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"gpt_tiny: d_model must divide into heads, got d_model={d_model}, heads={heads}")
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(),
                                 nn.Linear(mlp_ratio * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, documents = x[..., :-1], x[..., -1]
        b, s, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = document_mask(documents)
        a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, heads, S, d / heads)
        h = h + self.proj(a.transpose(1, 2).reshape(b, s, d))
        h = h + self.mlp(self.norm2(h))
        return torch.cat([h, documents.unsqueeze(-1)], dim=-1)


class LMHead(nn.Module):
    """The final LayerNorm and the (untied) projection to the vocabulary: (B, S, D + 1) -> (B, S, V) logits."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.norm, self.out = nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x[..., :-1]))


def gpt_tiny(vocab_size: int = 256, d_model: int = 64, layers: int = 2, heads: int = 4, max_positions: int = 2048,
             mlp_ratio: int = 4) -> nn.Sequential:
    """Token and learned position embeddings, ``layers`` pre-norm blocks, the final norm and the LM head.

    The head is not tied to the token embedding: a pipeline keeps them in different stages (on different ranks),
    where one shared weight would need its gradients summed across them. Weights start as GPT-2's (normal, std 0.02;
    biases 0). ``max_positions`` bounds ``position_ids``: a split document's pieces continue its positions, so it
    must exceed the longest document, not only the packed length.
    """
    for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("layers", layers), ("heads", heads),
                        ("max_positions", max_positions), ("mlp_ratio", mlp_ratio)):
        if value < 1:
            raise ValueError(f"gpt_tiny: {name} must be >= 1, got {value}")
    return decoder(TokenEmbedding(vocab_size, d_model, max_positions), vocab_size, d_model, layers, heads, mlp_ratio)


def decoder(embedding: nn.Module, vocab_size: int, d_model: int, layers: int, heads: int,
            mlp_ratio: int = 4) -> nn.Sequential:
    """``embedding`` (stage 0's input -> (B, S, D + 1)), ``layers`` blocks and the LM head, GPT-2's initial weights.

    Linear and embedding weights normal with std 0.02, their biases 0; other layers (a vision stem's convolution)
    keep torch's initialisation.
    """
    model = nn.Sequential(embedding, *(Block(d_model, heads, mlp_ratio) for _ in range(layers)),
                          LMHead(d_model, vocab_size))
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    return model


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, Hugging Face's shift: ``logits[:, :-1]`` against ``labels[:, 1:]``, -100 ignored.

    The mean over the labels that count; a batch with none (all padding) gives 0 with a gradient of 0, not NaN.
    """
    logits, labels = logits[:, :-1], labels[:, 1:]
    total = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                        ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (labels != IGNORE_INDEX).sum().clamp(min=1)
