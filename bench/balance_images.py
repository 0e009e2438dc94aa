"""``bench balance``'s image-text mix as real image-text shards, read by the Loader as any image-text source.

Each drawn document (:class:`~.balance_mixes.MixDraw`: ``length`` positions, ``k`` images of ``image_tokens`` each)
is written as ``length - image_tokens * k`` text tokens (id 1) and ``k`` images, each before the first text token
(a caption pair's place), with :func:`~stallfree.ingest.image_text_writer.write_image_text_shards`. The images are
one small PNG (:data:`SIDE` pixels square): what the bench measures is where documents go, so their pixels only
have to pass the image check and the Loader's graph, at a small fraction of the bench's time. The Loader is given
``Packing(image_tokens=image_tokens)``, so a document takes the positions it was drawn with, and its balance
charges each image ``Cost.image`` through the shards' image counts (``image_counts.npy``), as in training.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.bench.balance_mixes import MixDraw

__all__ = ["IMAGE_TOKEN_ID", "SIDE", "image_text_loader_options", "write_mix"]

#: Pixels on an image's side (the transforms resize to the same: nothing to scale).
SIDE = 8
#: The id of each image position (text ids are 1).
IMAGE_TOKEN_ID = 2


def _png() -> bytes:
    from PIL import Image

    pixels = np.zeros((SIDE, SIDE, 3), np.uint8)
    pixels[..., 0] = np.linspace(0, 255, SIDE, dtype=np.uint8)[None, :]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def write_mix(mix: MixDraw, folder: Path) -> Path:
    """``mix``'s documents as an image-text shard folder at ``folder`` (created); returns it.

    Raises:
        ValueError: the mix holds no image tokens, or a document fewer positions than its images take.
    """
    from stallfree.ingest.image_text_writer import ImageTextDocument, write_image_text_shards

    if mix.image_tokens < 1:
        raise ValueError("write_mix takes an image-text mix (image_tokens >= 1); this one has no images")
    text = mix.lengths - mix.image_tokens * mix.images
    if (text < 1).any():
        row = int(np.flatnonzero(text < 1)[0])
        raise ValueError(f"document {row} has {int(mix.lengths[row])} positions, fewer than its "
                         f"{int(mix.images[row])} images of {mix.image_tokens} take with one text token")
    png = _png()

    def documents() -> Iterator[Any]:
        for row, (n, k) in enumerate(zip(text.tolist(), mix.images.tolist(), strict=True)):
            yield ImageTextDocument(np.ones(n, np.int64), [png] * k, [0] * k, [(SIDE, SIDE)] * k,
                                    np.ones(n, np.uint8), f"bench-balance:{row}")

    write_image_text_shards(folder, documents(), vocab_size=IMAGE_TOKEN_ID + 1)
    return folder


def image_text_loader_options() -> dict[str, Any]:
    """The Loader's arguments for the written shards besides the packing's: a transform that ends at a fixed size."""
    from stallfree.transforms import Normalize, Resize

    return {"transform": [Resize((SIDE, SIDE)), Normalize()]}
