"""A generated, learnable caption dataset: images of one coloured shape, captions that say its colour, shape and place.

Each sample is one JPEG (a flat grey background with a little noise and one shape from :data:`CAPTION_SHAPES` in one
of :data:`COLOURS`, drawn in one of :data:`PLACES`' quarters or the centre) and its caption, e.g.
``"a red circle on the left"``. The caption is fixed by the pixels alone, so a vision-language model that reads
its image tokens can predict every caption word after ``"a"``; a model that ignores the image can only learn the
template (``a ... on the ...``) and the words' frequencies.

Written as the ingest's input (:func:`make_caption_dataset`)::

    ROOT/images/00000.jpg ...
    ROOT/captions.jsonl          {"image": "images/00000.jpg", "text": "a red circle on the left"} per line
    ROOT/conversations.jsonl     (layout "conversations") LLaVA's layout: a human turn asking "what is in the
                                 picture?" after its <image> placeholder, and a gpt turn holding the caption
    ROOT/tokenizer.json          a word-level Hugging Face tokenizer of every word either file uses (nothing to
                                 download): ``stallfree ingest ROOT/captions.jsonl OUT --tokenizer ROOT/tokenizer.json``

The same ``seed`` writes the same bytes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

from stallfree.ingest.synthetic import draw_shape

__all__ = ["CAPTION_SHAPES", "COLOURS", "PLACES", "CaptionLayout", "caption", "caption_vocabulary",
           "draw_caption_image", "make_caption_dataset", "write_caption_tokenizer"]

COLOURS: dict[str, tuple[int, int, int]] = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (40, 60, 220),
                                             "yellow": (235, 215, 30), "white": (250, 250, 250),
                                             "black": (10, 10, 10)}
CAPTION_SHAPES = ("circle", "square", "triangle", "cross")
# where the shape's centre is, as a fraction of (width, height)
PLACES: dict[str, tuple[float, float]] = {"left": (0.25, 0.5), "right": (0.75, 0.5), "top": (0.5, 0.25),
                                          "bottom": (0.5, 0.75), "centre": (0.5, 0.5)}
CaptionLayout = Literal["caption", "conversations"]
QUESTION = "<image>\nwhat is in the picture?"
# Special tokens, ids 0..3 in this order: padding, unknown words, and LLaVA v1's sequence start and end.
_SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
# Every word the captions, the question and LLaVA v1's template and system prompt use (an unknown word is <unk>).
_TEMPLATE = ("a on the what is in picture ? USER ASSISTANT SYSTEM : . , ' s A chat between curious human and an "
             "artificial intelligence assistant The gives helpful detailed polite answers to human's questions")


def caption_vocabulary() -> list[str]:
    """The tokenizer's words, id = index: the special tokens, then every word a caption or the template uses."""
    words = [*_SPECIALS]
    for word in [*_TEMPLATE.split(), *COLOURS, *CAPTION_SHAPES, *PLACES]:
        if word not in words:
            words.append(word)
    return words


def write_caption_tokenizer(path: str | os.PathLike[str]) -> Path:
    """Write a word-level ``tokenizer.json`` of :func:`caption_vocabulary` to ``path`` and return it.

    Words split on whitespace and punctuation; ``<s>``/``</s>`` are special tokens (found whole in text, as LLaVA's
    template writes ``</s>``); no post-processor, so ``--add-bos``/``--add-eos`` decide what frames a document.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = caption_vocabulary()
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(list(_SPECIALS))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def draw_caption_image(rng: np.random.Generator, size: tuple[int, int], colour: str, shape: str,
                       place: str) -> Image.Image:
    """One sample's image: a ``colour`` ``shape`` at ``place`` over grey noise, ``size`` = (height, width)."""
    h, w = size
    background = rng.integers(100, 156)  # mid grey: every colour, white and black included, stands out
    noise = rng.normal(0, 6, (h, w, 3))
    image = Image.fromarray(np.clip(background + noise, 0, 255).astype(np.uint8), "RGB")
    fx, fy = PLACES[place]
    r = rng.uniform(0.14, 0.2) * min(h, w)
    cx, cy = fx * w + rng.uniform(-0.04, 0.04) * w, fy * h + rng.uniform(-0.04, 0.04) * h
    draw_shape(ImageDraw.Draw(image), shape, cx, cy, r, COLOURS[colour])
    return image


def caption(colour: str, shape: str, place: str) -> str:
    """The caption of a ``colour`` ``shape`` at ``place``: ``"a red circle on the left"``, ``"... in the centre"``."""
    return f"a {colour} {shape} {'in the' if place == 'centre' else 'on the'} {place}"


def make_caption_dataset(root: str | os.PathLike[str], *, count: int = 256, size: tuple[int, int] = (64, 64),
                         vary_size: bool = False, seed: int = 0, quality: int = 90,
                         layout: CaptionLayout = "caption") -> Path:
    """Write ``count`` captioned images under ``root`` (see the module) and return the JSONL file's path.

    Args:
        root: folder to create (it may exist; files of the same names are overwritten).
        count: samples.
        size: ``(height, width)`` of each image.
        vary_size: vary each image's sides from 75% to 125% of ``size``'s, as real datasets' sizes vary.
        seed: the same seed writes the same bytes.
        quality: JPEG quality.
        layout: ``"caption"`` (``captions.jsonl``: ``image``, ``text``) or ``"conversations"``
            (``conversations.jsonl``: ``image``, ``conversations`` in LLaVA's layout).

    Raises:
        ValueError: a count under 1, a side under 16, or an unknown layout.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if len(size) != 2 or min(size) < 16:
        raise ValueError(f"size must be (height, width) with both sides >= 16, got {size}")
    if layout not in ("caption", "conversations"):
        raise ValueError(f"layout must be 'caption' or 'conversations', got {layout!r}")
    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    lines: list[dict[str, object]] = []
    for i in range(count):
        colour = str(rng.choice(list(COLOURS)))
        shape, place = str(rng.choice(CAPTION_SHAPES)), str(rng.choice(list(PLACES)))
        h, w = (int(s * rng.uniform(0.75, 1.25)) for s in size) if vary_size else size
        name = f"images/{i:05d}.jpg"
        draw_caption_image(rng, (h, w), colour, shape, place).save(root / name, "JPEG", quality=quality)
        text = caption(colour, shape, place)
        if layout == "caption":
            lines.append({"image": name, "text": text})
        else:
            lines.append({"image": name, "conversations": [{"from": "human", "value": QUESTION},
                                                           {"from": "gpt", "value": text}]})
    out = root / f"{'captions' if layout == 'caption' else 'conversations'}.jsonl"
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    write_caption_tokenizer(root / "tokenizer.json")
    return out
