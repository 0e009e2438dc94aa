"""Rendered image-text samples to token ids: where each image goes, and which tokens are targets.

A sample's pieces (:mod:`.conversation`) are cut at its image marks into parts; each part is encoded apart, without
special tokens (:meth:`~stallfree.ingest.tokenizer.TextTokenizer.encode_pieces`, every part of a batch of rows in
one ``encode_batch``), as LLaVA's ``tokenizer_image_token`` encodes the text between images, so an image's position
is a token boundary. An image goes before the first token of the part that follows it (``image_at``).

A token is a target when its last character lies in a target piece: byte-level BPE joins a reply's leading space
to its first word (``" A"``), and that token is the reply's. Around the document go the tokenizer's own special
tokens (its post-processor's, :meth:`~stallfree.ingest.tokenizer.TextTokenizer.wrapping`), then ``--add-bos`` and
``--add-eos`` (:class:`~stallfree.ingest.tokenizer.Specials`) where missing: targets in a caption (every caption
token is one), not in a conversation (its replies' end tokens are in the template already).
"""

from __future__ import annotations

import numpy as np

from stallfree.ingest.conversation import Piece
from stallfree.ingest.tokenizer import Specials, TextTokenizer

__all__ = ["Encoded", "encode_samples"]

#: A sample's text ids, each image's position in them, and the target flag of each id.
Encoded = tuple[np.ndarray, list[int], np.ndarray]


def _parts(pieces: list[Piece]) -> list[tuple[str, list[tuple[int, int]]]]:
    """The text between image marks (one more part than marks) and its target spans in characters."""
    parts: list[tuple[str, list[tuple[int, int]]]] = [("", [])]
    for piece in pieces:
        if piece.image:
            parts.append(("", []))
            continue
        text, spans = parts[-1]
        if piece.target:
            spans = [*spans, (len(text), len(text) + len(piece.text))]
        parts[-1] = (text + piece.text, spans)
    return parts


def encode_samples(tokenizer: TextTokenizer, samples: list[list[Piece]], specials: Specials,
                   all_targets: bool) -> list[Encoded]:
    """Each sample's ids, image positions and target flags (see the module); ``all_targets`` for captions."""
    cut = [_parts(pieces) for pieces in samples]
    encoded = iter(tokenizer.encode_pieces([text for parts in cut for text, _ in parts]))
    prefix, suffix = tokenizer.wrapping()
    out: list[Encoded] = []
    for parts in cut:
        ids: list[np.ndarray] = [np.asarray(prefix, np.int64)]
        flags: list[np.ndarray] = [np.full(len(prefix), all_targets, np.uint8)]
        at: list[int] = []
        count = len(prefix)
        for k, (_, spans) in enumerate(parts):
            if k:
                at.append(count)
            part, ends = next(encoded)
            target = np.zeros(len(part), bool)
            for start, stop in spans:
                target |= (ends - 1 >= start) & (ends - 1 < stop)
            ids.append(part)
            flags.append((target | all_targets).astype(np.uint8))
            count += len(part)
        ids.append(np.asarray(suffix, np.int64))
        flags.append(np.full(len(suffix), all_targets, np.uint8))
        tokens, assistant = np.concatenate(ids), np.concatenate(flags)
        head = specials.bos is not None and (len(tokens) == 0 or tokens[0] != specials.bos)
        tail = specials.eos is not None and (len(tokens) == 0 or tokens[-1] != specials.eos)
        if head or tail:
            tokens = specials.apply(tokens)
            assistant = np.concatenate([np.full(int(head), all_targets, np.uint8), assistant,
                                        np.full(int(tail), all_targets, np.uint8)])
            at = [a + int(head) for a in at]
        out.append((tokens, at, assistant))
    return out
