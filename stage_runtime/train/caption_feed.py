"""What feeds a vision model's stage 0 without a dataset: the caption task's image-text samples, generated and packed.

:class:`CaptionBatches` yields the Loader's packed image-text batches (issue 47's contract) of the learnable caption
task of :mod:`stallfree.ingest.synthetic_captions`: each document is one image (``(image_size / patch)**2`` tokens
of id ``vocab``, one past the caption words) followed by its caption's word ids and ``</s>``. The fields are the
token packs' (``input_ids``, ``labels``, ``position_ids``, ``document_index``, ``cu_seqlens``, ``max_seqlen``; labels
-100 on padding, on each document's first position and on image tokens) plus ``pixel_values`` (N_images, 3, H, W)
float32, normalized with ImageNet's mean and std as the Loader's ``Normalize()`` does, in the order their tokens
appear, and ``image_document_index`` (N_images) int64.

With a dataset the Loader packs an image-text shard folder the same way (:func:`image_text_packing`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stallfree.ingest.synthetic_captions import (
    CAPTION_SHAPES,
    COLOURS,
    PLACES,
    caption,
    caption_vocabulary,
    draw_caption_image,
)
from stallfree.stage_runtime.baseline import MEAN, STD
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.gpt import IGNORE_INDEX
from stallfree.stage_runtime.train.token_feed import TokenBatches

__all__ = ["CAPTION_VOCAB", "CaptionBatches", "image_text_packing", "image_text_transform"]

CAPTION_VOCAB = len(caption_vocabulary())  # the generated captions' vocabulary; their image token's id is this
_WORDS = {w: i for i, w in enumerate(caption_vocabulary())}

# One generated document: its first row-wide index, its token ids (image tokens first), its image (3, H, W).
_Document = tuple[int, torch.Tensor, torch.Tensor]


class CaptionBatches(TokenBatches):
    """``num_sequences`` packed rows of generated caption samples (see the module), ``batch_size`` a batch.

    As :class:`~.token_feed.TokenBatches` (the same order, sharding, epochs and state): row ``i`` is the same in
    every process and epoch, drawn from ``(seed, i, split)``; it holds whole documents only, as many as fit, the rest
    padding. ``image_size``: the images' side; ``patch``: the model's, so an image is ``(image_size / patch)**2``
    tokens.
    """

    def __init__(self, num_sequences: int, batch_size: int, seq_len: int, *, image_size: int, patch: int,
                 seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True, split: int = 0):
        self.image_size, self.patch = image_size, patch
        self.image_tokens = (image_size // patch) ** 2
        longest = self.image_tokens + len(caption("yellow", "triangle", "bottom").split()) + 1  # + </s>
        if longest > seq_len:
            raise ValueError(f"a generated caption sample is up to {longest} tokens ({self.image_tokens} of its "
                             f"image), more than a row of --seq-len {seq_len}: give a longer --seq-len or a smaller "
                             "--image-size")
        super().__init__(num_sequences, batch_size, seq_len, CAPTION_VOCAB, seed=seed, rank=rank,
                         world_size=world_size, shuffle=shuffle, split=split)

    @property
    def image_token_id(self) -> int:
        """The image tokens' id: one past the caption words (:data:`CAPTION_VOCAB`)."""
        return CAPTION_VOCAB

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order, the tokens and the pixels."""
        return {**super().fingerprint(), "kind": "CaptionBatches", "image_size": self.image_size,
                "patch": self.patch}

    def _row(self, index: int) -> list[_Document]:
        rng = np.random.default_rng([self.seed, index, self.split])
        mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
        docs: list[_Document] = []
        at = 0
        while True:
            colour, shape = str(rng.choice(list(COLOURS))), str(rng.choice(CAPTION_SHAPES))
            place = str(rng.choice(list(PLACES)))
            words = [_WORDS[w] for w in caption(colour, shape, place).split()] + [_WORDS["</s>"]]
            n = self.image_tokens + len(words)
            if at + n > self.seq_len:
                return docs
            image = draw_caption_image(rng, (self.image_size, self.image_size), colour, shape, place)
            pixels = torch.from_numpy(np.asarray(image, np.float32) / 255).permute(2, 0, 1)
            ids = torch.cat([torch.full((self.image_tokens,), self.image_token_id), torch.tensor(words)])
            docs.append((index * self.seq_len + at, ids, (pixels - mean) / std))
            at += n

    def _make_batch(self, rows: list[Any]) -> dict[str, Any]:
        shape = (len(rows), self.seq_len)
        ids, positions = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
        labels = torch.full(shape, IGNORE_INDEX, dtype=torch.int64)
        documents = torch.full(shape, -1, dtype=torch.int64)
        segments, images, image_documents = [0], [], []
        for r, docs in enumerate(rows):
            at = 0
            for doc, tokens, pixels in docs:
                n = len(tokens)
                ids[r, at:at + n], positions[r, at:at + n], documents[r, at:at + n] = tokens, torch.arange(n), doc
                labels[r, at + self.image_tokens:at + n] = tokens[self.image_tokens:]  # the caption alone
                images.append(pixels)
                image_documents.append(doc)
                at += n
                segments.append(segments[-1] + n)
            if at < self.seq_len:
                positions[r, at:] = torch.arange(self.seq_len - at)
                segments.append(segments[-1] + self.seq_len - at)
        lengths = [b - a for a, b in zip(segments, segments[1:], strict=False)]
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "document_index": documents,
                "cu_seqlens": torch.tensor(segments, dtype=torch.int32), "max_seqlen": max(lengths),
                "pixel_values": torch.stack(images), "image_document_index": torch.tensor(image_documents)}


def image_text_transform(image_size: int) -> list[Any]:
    """The Loader's transform of a vision job's images: resized to ``image_size`` square, normalized (ImageNet's)."""
    from stallfree.transforms import Normalize, Resize  # DALI is an extra: --synthetic trains without it

    return [Resize((image_size, image_size)), Normalize(MEAN, STD)]


def image_text_packing(config: TrainConfig, vocab: int) -> Any:
    """The Loader's ``Packing`` of a vision job over an image-text source of vocabulary ``vocab``.

    Each image is ``(image_size / patch)**2`` tokens of id ``vocab`` (one past the text's ids), counted in
    ``--seq-len``; the labels are every text token's, or a conversation's replies only (``--train-on assistant``).
    """
    from stallfree.pipeline.packing import Packing  # DALI is an extra: --synthetic trains without it

    m = config.model
    return Packing(seq_len=m.packed_len, image_tokens=m.image_tokens, image_token_id=vocab,
                   train_on=config.feed.train_on)
