"""What a sample is: its fields, by name and kind (DESIGN.md, "Sample kinds").

A sample kind is a set of fields. Every floor splits the work the same way for each kind: ``ingest`` writes the
fields as shard columns, a reader declares them and returns them by name, the Loader's graph decodes and transforms
the image fields whatever the kind, and the hand-off assembles the batch. An image with a label is the first kind;
token sequences and image-text samples add fields of their own kinds here and an assembly of their own, not an
``if kind ==`` in every file.

Two kinds of field differ in where they are read: a **per-sample** field (an encoded image, a token array) is read
with its sample, in the read stage; a **column** field (a label, a length) is read for every row at once, without
reading any sample, so that the sampler and the batcher know it before an epoch starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ASSISTANT", "COLUMN_KINDS", "IMAGE", "IMAGES", "IMAGE_AT", "IMAGE_COUNT", "IMAGE_FIELDS", "IMAGE_SIZES",
    "IMAGE_TEXT_FIELDS", "LABEL", "LENGTH", "TOKENS", "TOKEN_FIELDS", "Field", "FieldKind",
]

#: ``image``: encoded bytes (or HWC uint8 pixels) decoded in the graph; ``label``: an int64 class per row;
#: ``tokens``: a document's token ids (1-D integers); ``length``: its length in tokens, per row; ``images``: a
#: document's encoded images (a list of bytes); ``image_at``: per image, the token index it goes before;
#: ``image_sizes``: per image, height then width; ``assistant``: per token, 1 for a target token (uint8);
#: ``image_count``: a document's number of images, per row.
FieldKind = Literal["image", "label", "tokens", "length", "images", "image_at", "image_sizes", "assistant",
                    "image_count"]

#: The kinds read as whole columns, never with a sample.
COLUMN_KINDS: tuple[FieldKind, ...] = ("label", "length", "image_count")


@dataclass(frozen=True)
class Field:
    """One field of a sample: its ``name`` (the key a reader returns it under) and its ``kind``."""

    name: str
    kind: FieldKind

    @property
    def per_sample(self) -> bool:
        """Whether it is read with its sample (not as a column of every row)."""
        return self.kind not in COLUMN_KINDS


IMAGE = Field("image", "image")
LABEL = Field("label", "label")

#: The image kind: an image and its class.
IMAGE_FIELDS: tuple[Field, ...] = (IMAGE, LABEL)

TOKENS = Field("tokens", "tokens")
LENGTH = Field("length", "length")

#: The token-sequence kind: a document's tokens and its length (known for every row before an epoch starts).
TOKEN_FIELDS: tuple[Field, ...] = (TOKENS, LENGTH)

IMAGES = Field("images", "images")
IMAGE_AT = Field("image_at", "image_at")
IMAGE_SIZES = Field("image_sizes", "image_sizes")
ASSISTANT = Field("assistant", "assistant")
IMAGE_COUNT = Field("image_count", "image_count")

#: The image-text kind (``stallfree.ingest.image_text_writer``'s shards): a document's text tokens and length, its
#: encoded images, where each goes in the tokens and its size, which tokens are targets, and its image count (known
#: for every row before an epoch starts, as its length is).
IMAGE_TEXT_FIELDS: tuple[Field, ...] = (TOKENS, LENGTH, IMAGES, IMAGE_AT, IMAGE_SIZES, ASSISTANT, IMAGE_COUNT)
