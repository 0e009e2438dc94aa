"""``bench balance``'s data: two generated length mixes, each document's length (and image count) from a seed.

Nothing is downloaded or written: the lengths are drawn from ``(seed, mix)`` alone, and the Loader reads the
documents from :class:`GeneratedDocuments`, an in-memory token source (a document's ids are all 1: the balance and
the simulated accelerator look at lengths only).

- ``chat``: a chat mix with a tail of long documents: 97% lognormal (median 200 tokens, sigma 1.0, clipped to
  16..S), 3% near a row (uniform 0.75 S .. S).
- ``image-text``: an image-text-like mix: a caption or turn of text (lognormal, median 150, sigma 0.8, clipped to
  8..1024) and k images, each counted as ``IMAGE_TOKENS`` tokens in the document's length (as the image-text kind
  counts them) and charged ``Cost.image`` for its vision encoder: k is 0 (20%), 1 (60%), 2-4 (15%) or 8-12 (5%).
  The Loader has no image-text samples yet: it delivers these documents as token sequences of that length, and
  balances what it knows (their tokens); the images are known to the bench's simulated accelerator and to the
  balance's planner (:func:`~stallfree.pipeline.balance.balanced_packs`), which the bench runs beside the Loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["IMAGE_TOKENS", "MIXES", "Mix", "MixDraw", "draw"]

#: Tokens an image adds to its document's length (a ViT's patches of a 224-pixel image at 14 pixels: 16 x 16).
IMAGE_TOKENS = 256


@dataclass(frozen=True)
class MixDraw:
    """A drawn mix: every document's length in tokens (images' tokens counted) and image count, in row order."""

    lengths: np.ndarray  # int64 [documents]
    images: np.ndarray  # int64 [documents]


@dataclass(frozen=True)
class Mix:
    """A law of documents: ``draw(rng, n, seq_len)`` gives ``n`` documents' (lengths, images)."""

    name: str
    law: str  # the law, in words: what --help and the output say
    draw: Callable[[np.random.Generator, int, int], tuple[np.ndarray, np.ndarray]]
    images: bool  # whether its documents carry images


def _chat(rng: np.random.Generator, n: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    body = np.clip(np.rint(rng.lognormal(np.log(200), 1.0, n)), 16, seq_len)
    near = rng.integers(max(1, (3 * seq_len) // 4), seq_len + 1, n)
    lengths = np.where(rng.random(n) < 0.03, near, body).astype(np.int64)
    return lengths, np.zeros(n, np.int64)


def _image_text(rng: np.random.Generator, n: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    import numpy as np

    text = np.clip(np.rint(rng.lognormal(np.log(150), 0.8, n)), 8, 1024).astype(np.int64)
    which = rng.random(n)
    images = np.select([which < 0.20, which < 0.80, which < 0.95],
                       [0, 1, rng.integers(2, 5, n)], rng.integers(8, 13, n)).astype(np.int64)
    return text + IMAGE_TOKENS * images, images


MIXES = {
    mix.name: mix
    for mix in (
        Mix("chat", "chat with a tail of long documents: 97% lognormal (median 200 tokens, sigma 1.0, clipped to "
            "16..S), 3% near a row (uniform 0.75 S .. S)", _chat, False),
        Mix("image-text", f"image-text-like: text lognormal (median 150, sigma 0.8, clipped to 8..1024) + k images "
            f"of {IMAGE_TOKENS} tokens each in the length, k = 0 (20%), 1 (60%), 2-4 (15%), 8-12 (5%)",
            _image_text, True),
    )
}


def draw(name: str, tokens: int, seq_len: int, seed: int) -> MixDraw:
    """Mix ``name``'s documents until their lengths reach ``tokens``: the same arguments, the same documents."""
    import numpy as np

    mix = MIXES[name]
    rng = np.random.default_rng([seed, list(MIXES).index(name)])
    lengths, images = mix.draw(rng, max(16, tokens // 100), seq_len)  # more than enough: means are >= 100
    while lengths.sum() < tokens:
        more, more_images = mix.draw(rng, len(lengths), seq_len)
        lengths, images = np.concatenate([lengths, more]), np.concatenate([images, more_images])
    n = int(np.searchsorted(np.cumsum(lengths), tokens)) + 1
    return MixDraw(lengths[:n].copy(), images[:n].copy())
