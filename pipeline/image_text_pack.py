"""Image-text documents as packed rows: each image's tokens put where it goes, and the lengths packing plans with.

A document of ``L`` text tokens and ``k`` images stands for ``L + N * k`` positions of a row (``N``:
``Packing(image_tokens=)``, one count for every image since the transforms end at one size). Image ``j``'s ``N``
positions hold ``image_token_id`` and go before text token ``image_at[j]`` (a caption pair's image before its
text), so in the row image ``j`` starts at ``image_at[j] + N * j``. Its labels are -100 there, as on padding and on
the first position of each piece; with ``train_on="assistant"`` also on the tokens the shard marks 0 in
``assistant`` (prompts, user turns, template text).

A document always fits its row: one whose positions exceed ``seq_len`` is refused by row when the Loader is built
(whatever ``Packing(long=)``), so a pack never cuts an image's tokens apart; text-only documents mixed in
(``stallfree.Mix``) split or truncate as ``long`` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.ingest.fields import ASSISTANT, IMAGE_AT, IMAGES, TOKENS
from stallfree.pipeline.packing import Packing

__all__ = ["Expanded", "check_fit", "expand", "packed_lengths"]


@dataclass(frozen=True)
class Expanded:
    """One document's row positions: ``ids``, which are ``targets``, and where each image's positions start."""

    ids: np.ndarray  # int64 [positions]
    targets: np.ndarray  # bool [positions]
    image_starts: np.ndarray  # int64 [images]
    images: list[np.ndarray]  # each image's encoded bytes


def expand(sample: Any, per_image: int, image_token_id: int, train_on: str) -> Expanded:
    """The row positions of a document read by a reader (``{"tokens"}``, and for image-text its other fields)."""
    tokens = np.asarray(sample[TOKENS.name], np.int64)
    images = list(sample.get(IMAGES.name, ())) if hasattr(sample, "get") else []
    marks = sample.get(ASSISTANT.name) if hasattr(sample, "get") else None
    text_targets = np.ones(len(tokens), bool) if train_on == "all" or marks is None else np.asarray(marks) == 1
    if not images:
        return Expanded(tokens, text_targets, np.empty(0, np.int64), [])
    at = np.asarray(sample[IMAGE_AT.name], np.int64)
    where = np.repeat(at, per_image)  # np.insert puts every value given for one index there, in order
    ids = np.insert(tokens, where, image_token_id)
    targets = np.insert(text_targets, where, False)
    starts = at + per_image * np.arange(len(at), dtype=np.int64)
    return Expanded(ids, targets, starts, images)


def packed_lengths(lengths: np.ndarray, counts: np.ndarray, per_image: int) -> np.ndarray:
    """Every document's positions in a row: its text tokens and ``per_image`` for each of its images."""
    return np.asarray(lengths, np.int64) + per_image * np.asarray(counts, np.int64)


def check_fit(packed: np.ndarray, counts: np.ndarray, packing: Packing, describe: Any) -> None:
    """Refuse a document with images longer than a row (named by row): its images' tokens would be cut apart.

    Raises:
        ValueError: naming the row (``describe(row)``), its positions and what to change.
    """
    seq = int(packing.seq_len)
    over = np.flatnonzero((packed > seq) & (np.asarray(counts) > 0))
    if len(over):
        row = int(over[0])
        raise ValueError(f"{describe(row)} (row {row}) takes {int(packed[row])} positions with its "
                         f"{int(counts[row])} image(s) at image_tokens each, more than seq_len={seq}: a document with "
                         f"images must fit one row (its images' tokens are never cut apart); {len(over)} such "
                         "document(s): raise seq_len, lower image_tokens, or leave them out at ingest")
