"""``bench balance``'s data: two generated length mixes, each document's length (and image count) from a seed.

Nothing is downloaded: the lengths are drawn from ``(seed, mix)`` alone. The Loader reads the chat documents from
an in-memory token source (:class:`~.balance_feeds.GeneratedDocuments`; a document's ids are all 1: the balance and
the simulated accelerator look at lengths only) and the image-text ones from shards written to a temporary folder.

- ``chat``: a chat mix with a tail of long documents: 97% lognormal (median 200 tokens, sigma 1.0, clipped to
  16..S), 3% near a row (uniform 0.75 S .. S).
- ``image-text``: an image-text mix: a caption or turn of text (lognormal, median 150, sigma 0.8, clipped to
  8..1024, and to S/4 below S = 4096) and k images, each counted as ``image_tokens(S)`` positions in the document's
  length (256, a ViT's 16 x 16 patches; S/16 below S = 4096, so that every document fits its row, as an image-text
  document must) and charged ``Cost.image`` for its vision encoder: k is 0 (20%), 1 (60%), 2-4 (15%) or 8-12 (5%).
  The bench writes these documents as image-text shards (:mod:`.balance_images`: their text, and k small images
  each) and the Loader packs them as it packs any image-text source, images known to its balance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["IMAGE_TOKENS", "MIXES", "Mix", "MixDraw", "draw", "image_tokens"]

#: Tokens an image adds to its document's length (a ViT's patches of a 224-pixel image at 14 pixels: 16 x 16).
IMAGE_TOKENS = 256


def image_tokens(seq_len: int) -> int:
    """Positions an image takes in a row of ``seq_len``: 256, or S/16 below S = 4096.

    A document of 12 images and its longest text (S/4 below S = 4096) then fills a row exactly.
    """
    return max(1, min(IMAGE_TOKENS, seq_len // 16))


@dataclass(frozen=True)
class MixDraw:
    """A drawn mix: every document's length in tokens (images' tokens counted) and image count, in row order."""

    lengths: np.ndarray  # int64 [documents]
    images: np.ndarray  # int64 [documents]
    image_tokens: int = 0  # positions each image takes in its document's length


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

    text = np.clip(np.rint(rng.lognormal(np.log(150), 0.8, n)), 8, max(8, min(1024, seq_len // 4))).astype(np.int64)
    which = rng.random(n)
    images = np.select([which < 0.20, which < 0.80, which < 0.95],
                       [0, 1, rng.integers(2, 5, n)], rng.integers(8, 13, n)).astype(np.int64)
    return text + image_tokens(seq_len) * images, images


MIXES = {
    mix.name: mix
    for mix in (
        Mix("chat", "chat with a tail of long documents: 97% lognormal (median 200 tokens, sigma 1.0, clipped to "
            "16..S), 3% near a row (uniform 0.75 S .. S)", _chat, False),
        Mix("image-text", "captions and turns with images: text lognormal (median 150, sigma 0.8, clipped to "
            f"8..1024) + k images of {IMAGE_TOKENS} tokens each in the length (below S = 4096: text to S/4, images "
            "of S/16), k = 0 (20%), 1 (60%), 2-4 (15%), 8-12 (5%)",
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
    return MixDraw(lengths[:n].copy(), images[:n].copy(), image_tokens(seq_len) if mix.images else 0)
