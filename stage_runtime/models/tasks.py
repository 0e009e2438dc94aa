"""What a model is trained to do, as the trainer reads it: a feed's item becomes a :class:`Batch`, scored by a loss.

A job's task (:func:`make_task`) is chosen once, from its model, never by looking at a batch: an image classifier
(:class:`ImageClassification`: a feed yields ``(images, labels)``) or a language model on packed token sequences
(:class:`LanguageModeling`: a feed yields the Loader's packed dicts). Both give the trainer the same thing, a
:class:`Batch`: the tensor stage 0 takes, the tensor the last stage scores, and how many samples (images or real
tokens) it holds, so one path trains both::

    feed item ──task.batch──► Batch(inputs ─► stage 0 ... last stage ◄─ targets: task.loss / task.score)

The pipeline's static shapes come from :meth:`Task.example` (stage 0's input of one micro-batch) and
:meth:`Task.target_shape` (what the last stage receives from stage 0 each step). Under a simulated accelerator each
stage charges a micro-batch its :meth:`Task.work`, read from the stage's own input, and a stand-in passes on what
the next stage reads of it (:meth:`Task.passed_on`: a token model's documents).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import nn

from stallfree.core.cost import Cost
from stallfree.stage_runtime.models.gpt import IGNORE_INDEX, boundary_documents, document_lengths, lm_loss
from stallfree.stage_runtime.models.vision import image_text_input

__all__ = ["Batch", "ImageClassification", "ImageTextModeling", "LanguageModeling", "Task", "TaskKind", "make_task"]

TaskKind = Literal["images", "tokens"]


@dataclass(frozen=True)
class Batch:
    """One step's batch as the trainer moves it: stage 0's input, the last stage's target, what it counts.

    ``samples``: images, or real (not padding) tokens: what the throughput that the job reports counts.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    samples: int


class Task(Protocol):
    """What the trainer needs of a model's task: batches from a feed's items, shapes, the loss and the score."""

    @property
    def unit(self) -> TaskKind:
        """What a sample is and the throughput counts: ``"images"`` or ``"tokens"``."""
        ...

    @property
    def per_sample(self) -> int:
        """Units a batch row holds: 1 image, or ``seq_len`` token positions."""
        ...

    def batch(self, item: Any) -> Batch:
        """A feed's item (``(images, labels)``, or the Loader's packed dict) as a :class:`Batch`."""
        ...

    def example(self, micro: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Stage 0's input of one micro-batch of ``micro`` rows, with valid values (on ``"meta"``: shapes alone)."""
        ...

    def target_shape(self, rows: int) -> tuple[int, ...]:
        """The targets' shape for ``rows`` rows (int64), as the last stage receives them."""
        ...

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The training loss of the last stage's output."""
        ...

    def score(self, output: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
        """``(right, counted)``: top-1 predictions that match a target, of the targets that count."""
        ...

    def drop_rows(self, target: torch.Tensor, start: int) -> torch.Tensor:
        """``target`` with its rows from ``start`` on left out of the score (an evaluation shard's padding)."""
        ...

    def work(self, x: torch.Tensor) -> float:
        """A micro-batch's work on the simulated device, from any stage's input: images, or its tokens' cost."""
        ...

    def passed_on(self, x: torch.Tensor) -> torch.Tensor | None:
        """What a stand-in (a stage computing nothing) must still hand on, from its input; ``None``: nothing.

        (B, S), put in the last channel of the stand-in's output: what the next stage reads of it besides its shape.
        """
        ...


@dataclass(frozen=True)
class ImageClassification:
    """Images in, one label each out: the feed yields ``(images, labels)``; cross entropy, top-1 accuracy."""

    image_size: int
    channels: int = 3

    @property
    def unit(self) -> TaskKind:
        return "images"

    @property
    def per_sample(self) -> int:
        return 1

    def batch(self, item: Any) -> Batch:
        images, labels = item
        return Batch(images, labels, len(labels))

    def example(self, micro: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.randn(micro, self.channels, self.image_size, self.image_size, device=device)

    def target_shape(self, rows: int) -> tuple[int, ...]:
        return (rows,)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target)

    def score(self, output: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
        target = target.to(output.device)
        return int((output.argmax(1) == target).sum()), int((target >= 0).sum())

    def drop_rows(self, target: torch.Tensor, start: int) -> torch.Tensor:
        target = target.clone()
        target[max(0, start):] = -1
        return target

    def work(self, x: torch.Tensor) -> float:
        return float(x.shape[0])  # images: the device's rate counts them

    def passed_on(self, x: torch.Tensor) -> torch.Tensor | None:
        return None


@dataclass(frozen=True)
class LanguageModeling:
    """Next-token prediction on packed sequences (:mod:`.gpt`): the feed yields the Loader's packed dicts.

    Stage 0 takes ``[input_ids, position_ids, document_index]`` stacked as (B, 3, S) int64; the last stage scores
    ``labels`` (B, S) with Hugging Face's shift (:func:`~.gpt.lm_loss`). ``cu_seqlens`` and ``max_seqlen`` are not
    read: the mask is built from ``document_index``, which says the same per row.

    ``cost``: a micro-batch's work on the simulated device, the summed cost of its documents (each segment with
    ``document_index >= 0``; a split document's piece counts as a document of its own length) plus the linear part
    of every padding slot (a device with static shapes runs each slot through the layers; attention stays within
    documents). Default ``Cost.attention(seq_len)``: attention over a full row as costly as the linear part.
    """

    seq_len: int
    vocab_size: int
    cost: Cost | None = None

    @property
    def unit(self) -> TaskKind:
        return "tokens"

    @property
    def per_sample(self) -> int:
        return self.seq_len

    def batch(self, item: Any) -> Batch:
        fields: Mapping[str, torch.Tensor] = item
        documents = fields["document_index"]
        if documents.shape[-1] != self.seq_len:
            raise ValueError(f"a packed batch of {documents.shape[-1]} tokens per row reached a job of --seq-len "
                             f"{self.seq_len}; give the Loader Packing(seq_len={self.seq_len})")
        inputs = torch.stack([fields["input_ids"], fields["position_ids"], documents], dim=1)
        return Batch(inputs, fields["labels"], int((documents >= 0).sum()))

    def example(self, micro: int, device: torch.device | str = "cpu") -> torch.Tensor:
        s = self.seq_len
        if torch.device(device).type == "meta":
            return torch.empty(micro, 3, s, dtype=torch.int64, device=device)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(self.vocab_size, (micro, s), generator=g)
        documents = torch.arange(s) * 4 // s  # four documents a row: the mask is built and applied as in training
        positions = torch.arange(s) - (documents * s + 3) // 4
        return torch.stack([ids, positions.expand(micro, s), documents.expand(micro, s)], dim=1).to(device)

    def target_shape(self, rows: int) -> tuple[int, ...]:
        return (rows, self.seq_len)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return lm_loss(output, target)

    def score(self, output: torch.Tensor, target: torch.Tensor) -> tuple[int, int]:
        predicted, target = output[:, :-1].argmax(-1), target[:, 1:].to(output.device)
        counts = target != IGNORE_INDEX
        return int(((predicted == target) & counts).sum()), int(counts.sum())

    def drop_rows(self, target: torch.Tensor, start: int) -> torch.Tensor:
        target = target.clone()
        target[max(0, start):] = IGNORE_INDEX
        return target

    def work(self, x: torch.Tensor) -> float:
        cost = self.cost or Cost.attention(self.seq_len)
        lengths = document_lengths(boundary_documents(x)).numpy()
        padding = x.shape[0] * self.seq_len - int(lengths.sum())
        return cost.lengths(lengths) + cost.linear * padding

    def passed_on(self, x: torch.Tensor) -> torch.Tensor | None:
        return boundary_documents(x)  # every block builds its mask from them (gpt.py)


@dataclass(frozen=True)
class ImageTextModeling(LanguageModeling):
    """Next-token prediction on packed image-text sequences (:mod:`.vision`): the feed yields the Loader's dicts.

    As :class:`LanguageModeling`, with ``pixel_values`` (N_images, C, H, W) beside the token fields: stage 0 takes
    :func:`~.vision.image_text_input` of them, (B, S, 3 + C*P*P + 1) float32, each image's ``(image_size /
    patch)**2`` patches at the positions whose id is ``image_token_id`` (outside the text's vocabulary: the job uses
    the vocabulary's size). The labels are the Loader's (-100 on image tokens), so only text is scored.
    """

    image_token_id: int = 0
    patch: int = 8
    image_size: int = 32
    channels: int = 3

    @property
    def image_tokens(self) -> int:
        """Tokens per image: ``(image_size / patch)**2`` (the Loader's ``Packing(image_tokens=)``)."""
        return (self.image_size // self.patch) ** 2

    def batch(self, item: Any) -> Batch:
        fields: Mapping[str, torch.Tensor] = item
        documents = fields["document_index"]
        if documents.shape[-1] != self.seq_len:
            raise ValueError(f"a packed batch of {documents.shape[-1]} tokens per row reached a job of --seq-len "
                             f"{self.seq_len}; give the Loader Packing(seq_len={self.seq_len})")
        if "pixel_values" not in fields:
            raise ValueError(f"a batch without pixel_values reached a vision model (fields: {sorted(fields)}); "
                             "train it on image-text samples, or train a text-only source with --model gpt_tiny")
        inputs = image_text_input(fields["input_ids"], fields["position_ids"], documents, fields["pixel_values"],
                                  self.image_token_id, self.patch)
        return Batch(inputs, fields["labels"], int((documents >= 0).sum()))

    def example(self, micro: int, device: torch.device | str = "cpu") -> torch.Tensor:
        s, width = self.seq_len, 3 + self.channels * self.patch ** 2 + 1
        if torch.device(device).type == "meta":
            return torch.empty(micro, s, width, device=device)
        text = super().example(micro)  # (B, 3, S): ids, positions, four documents a row
        ids = text[:, 0].clone()
        ids[:, :self.image_tokens] = self.image_token_id  # each row opens with one image (the job checks it fits)
        g = torch.Generator().manual_seed(0)
        pixels = torch.randn(micro, self.channels, self.image_size, self.image_size, generator=g)
        return image_text_input(ids, text[:, 1], text[:, 2], pixels, self.image_token_id, self.patch).to(device)


def make_task(kind: TaskKind, *, image_size: int, seq_len: int, outputs: int, cost: Cost | None = None,
              patch: int | None = None) -> Task:
    """The task of a model of ``kind``: ``outputs`` is the class count, or the vocabulary of a token model.

    ``cost``: a token model's cost of a document on the simulated device (default: ``Cost.attention(seq_len)``).
    ``patch``: a token model with a vision stem (``vlm_tiny``): its patch side; its images are ``image_size``
    square and its image token's id is ``outputs`` (one past the text's vocabulary).
    """
    if kind == "tokens" and patch is not None:
        return ImageTextModeling(seq_len, outputs, cost, image_token_id=outputs, patch=patch, image_size=image_size)
    if kind == "tokens":
        return LanguageModeling(seq_len, outputs, cost)
    return ImageClassification(image_size)
