"""Packed batches of image-text documents: their tokens as token packs are, their images through the DALI graph.

A token run (:mod:`.token_run`) makes each batch in a thread of its own; for image-text documents its builder,
:class:`ImageTextBatches`, also gathers the batch's images in the order their tokens appear (row-major), checks each
header (the one image check, :func:`~stallfree.ingest.images.read_header`), draws each image's transform parameters
keyed by ``(seed, epoch, image ordinal)`` (the ordinal: the image's index over the dataset, from the documents'
image counts) and runs them through the Loader's DALI graph (the compiled spec image samples use, ``device=``), a
chunk of images at a time. So an image's pixels are the same whichever rank, pack or position it lands in.

A document whose image fails (its header, or in the graph) follows ``on_error`` for the whole document:
``"raise"`` raises :class:`~stallfree.pipeline.samples.BadSampleError` naming its row; ``"skip"`` leaves it out of
its pack (its positions become padding, its images leave ``pixel_values``) and lists it in the Loader's ``skipped``
with ``"document": True``; its pack stays, so every rank's batches stay as many as without the skip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from stallfree.ingest.images import BadImage, Exif, read_header
from stallfree.pipeline.graph import Graph, GraphError
from stallfree.pipeline.image_text_pack import expand
from stallfree.pipeline.packing import EMPTY, PackOrder, PackPlan
from stallfree.pipeline.samples import BadSampleError
from stallfree.pipeline.token_run import IGNORE, SKIPPED, TokenParts, TokenPlacement
from stallfree.transforms.random import batch_random

if TYPE_CHECKING:
    from stallfree.pipeline.options import LoaderOptions
    from stallfree.pipeline.reader_base import Reader
    from stallfree.pipeline.run_config import RunParts
    from stallfree.transforms.compile import CompiledTransforms

__all__ = ["IMAGE_CHUNK", "ImageGraph", "ImageTextBatches", "ImageTextPlacement", "Pixels", "pixels_of"]

#: Images the graph takes at once (a batch's images run in chunks of this many; the pixels do not depend on it).
IMAGE_CHUNK = 64

#: A piece of a batch: its row of the batch, its document's row, its span, the document's repeat in the epoch.
Piece = tuple[int, int, int, int, int]
#: An image of a batch: its document's row, its place in the document, the document's repeat in the epoch.
Key = tuple[int, int, int]

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8}


class ImageGraph:
    """The DALI graph image-text batches share, built on first use (in the run's thread) and used under a lock."""

    def __init__(self, **keywords: Any):
        self._keywords = keywords
        self._graph: Graph | None = None
        self._lock = threading.Lock()

    def run(self, images: list[np.ndarray], params: dict[str, list[np.ndarray]]) -> torch.Tensor:
        """``images`` transformed (see :meth:`Graph.run`; a :class:`GraphError` names the bad ones)."""
        with self._lock:
            if self._graph is None:
                self._graph = Graph(**self._keywords)
            with self._graph.lock:
                return self._graph.run(images, params)


@dataclass(frozen=True)
class Pixels:
    """How a batch's images become ``pixel_values``: the spec, its parameters' keys and the graph."""

    compiled: CompiledTransforms
    graph: ImageGraph
    seed: int
    max_pixels: int
    exif: Exif
    on_error: Literal["raise", "skip"]

    def empty(self) -> torch.Tensor:
        """``pixel_values`` of a batch without images: [0, C, H, W] (or [0, H, W, C]) of the spec's dtype."""
        c, (h, w) = self.compiled.channels, self.compiled.output_size
        shape = (0, h, w, c) if self.compiled.layout == "NHWC" else (0, c, h, w)
        return torch.empty(shape, dtype=_TORCH_DTYPES[self.compiled.dtype])


def pixels_of(options: LoaderOptions) -> Pixels:
    """The Loader's pixels: its compiled spec and a graph placed as image samples' (``device=``, ``placement=``)."""
    decode, order = options.decode, options.order
    graph = ImageGraph(compiled=decode.compiled, batch_size=IMAGE_CHUNK, num_threads=options.run.threads,
                       device_id=options.graph_device, encoded=True, seed=order.seed, exif=decode.exif,
                       pin_memory=options.output.pin_memory)
    return Pixels(decode.compiled, graph, int(order.seed), int(decode.max_pixels), decode.exif, decode.on_error)


@dataclass(frozen=True, eq=False)
class ImageTextBatches:
    """Packs of image-text (and text) documents as ``[B, S]`` rows, with ``pixel_values`` and ``image_document_index``.

    Args:
        order: the packs.
        reader: the documents.
        per_image: positions each image takes (``Packing.tokens_per_image`` of the transforms' output size).
        first_image: each row's first image ordinal (the image counts' running sum; ``len`` rows + 1). An image's
            parameters are keyed by ``(seed, epoch, ordinal)``, its document's ``k``-th repeat in an epoch by
            ``ordinal + k * images``.
        pixels: how the images are decoded and transformed.
    """

    order: PackOrder
    reader: Reader
    per_image: int
    first_image: np.ndarray
    pixels: Pixels

    @property
    def images(self) -> int:
        """The dataset's images: a repeat's ordinals follow the first time's (ordinal + repeat * images)."""
        return int(self.first_image[-1])

    def __call__(self, ids: np.ndarray, epoch: int) -> tuple[np.ndarray, dict[str, Any]]:
        plan, packing = self.order.plan(epoch), self.order.packing
        image_id = int(packing.image_token_id or 0)
        pieces = list(self._pieces(plan, ids))
        docs = {row: expand(self.reader.read(row), self.per_image, image_id, packing.train_on)
                for row in dict.fromkeys(row for _, row, _, _, _ in pieces)}
        order = [(row, j, seen) for _, row, _, _, seen in pieces for j in range(len(docs[row].images))]
        bad, skipped, sizes = self._bad_headers(docs, order, epoch)
        pixels = self._run(docs, sizes, [key for key in order if key[0] not in bad], bad, skipped, epoch)
        pack_of = {row: r for r, row, _, _, _ in pieces}  # a document with images is one piece: it fits its row
        for record in skipped:
            record["pack"] = pack_of[record["index"]]  # the run turns it into the pack's stream position
        return self._rows(ids, pieces, docs, bad, pixels, skipped)

    def _pieces(self, plan: PackPlan, ids: np.ndarray) -> Any:
        """``(row of the batch, document row, begin, end, repeat)`` of every piece, row-major.

        ``repeat``: the document's earlier times in the epoch's order (example ``echo``, or a Mix's source read again
        within an epoch): each time its images are drawn afresh.
        """
        rows = self.order.num_rows
        for r, pack in enumerate(ids.tolist()):
            if pack == EMPTY:
                continue
            for i in range(int(plan.starts[pack]), int(plan.starts[pack + 1])):
                virtual = int(plan.virtual[i])
                yield r, virtual % rows, int(plan.begin[i]), int(plan.end[i]), virtual // rows

    def _skip(self, row: int, reason: str, epoch: int, bad: set[int], skipped: list[dict[str, Any]]) -> None:
        source = self.reader.describe(row)
        if self.pixels.on_error == "raise":
            raise BadSampleError(source, row, reason)
        if row not in bad:
            bad.add(row)
            skipped.append({"index": row, "source": source, "reason": reason, "epoch": epoch, "document": True})

    def _bad_headers(self, docs: dict[int, Any], order: list[Key], epoch: int,
                     ) -> tuple[set[int], list[dict[str, Any]], dict[tuple[int, int], tuple[int, int]]]:
        """The documents whose image fails its header check, their records, and every other image's size."""
        bad: set[int] = set()
        skipped: list[dict[str, Any]] = []
        sizes: dict[tuple[int, int], tuple[int, int]] = {}
        for row, j, _ in order:
            try:
                header = read_header(docs[row].images[j], self.pixels.max_pixels, exif=self.pixels.exif)
            except BadImage as err:
                self._skip(row, f"image {j}: {err.reason}", epoch, bad, skipped)
                continue
            sizes[(row, j)] = (header.height, header.width)
        return bad, skipped, sizes

    def _run(self, docs: dict[int, Any], sizes: dict[tuple[int, int], tuple[int, int]], todo: list[Key],
             bad: set[int], skipped: list[dict[str, Any]], epoch: int) -> tuple[list[Key], torch.Tensor]:
        """The good images, in order, and their pixels; a document whose image fails in the graph joins ``bad``.

        The graph's output is the batch's ``pixel_values`` as it is where one chunk holds every image (no copy: a
        copy of 12 MB of float pixels costs tens of ms on a busy host); chunks are joined otherwise.
        """
        done: list[tuple[list[Key], torch.Tensor]] = []
        while todo:
            chunk, todo = todo[:IMAGE_CHUNK], todo[IMAGE_CHUNK:]
            ordinals = [int(self.first_image[row]) + j + seen * self.images for row, j, seen in chunk]
            params = self.pixels.compiled.draw(batch_random(self.pixels.seed, epoch, ordinals),
                                               [sizes[(row, j)] for row, j, _ in chunk])
            try:
                out = self.pixels.graph.run([docs[row].images[j] for row, j, _ in chunk], params)
            except GraphError as failure:
                if not failure.bad:
                    raise
                for i, reason in zip(failure.bad, failure.reasons, strict=True):
                    row, j, _ = chunk[i]
                    self._skip(row, f"image {j}: decoding failed: {reason}", epoch, bad, skipped)
                done = [_without(keys, px, bad) for keys, px in done]  # a failed document's earlier images too
                todo = [key for key in chunk + todo if key[0] not in bad]
                continue
            done.append((chunk, out))
        done = [(keys, px) for keys, px in done if keys]
        if not done:
            return [], self.pixels.empty()
        keys = [key for part, _ in done for key in part]
        return keys, done[0][1] if len(done) == 1 else torch.cat([px for _, px in done])

    def _rows(self, ids: np.ndarray, pieces: list[Piece], docs: dict[int, Any], bad: set[int],
              pixels: tuple[list[Key], torch.Tensor], skipped: list[dict[str, Any]],
              ) -> tuple[np.ndarray, dict[str, Any]]:
        packing = self.order.packing
        seq = int(packing.seq_len)
        shape = (len(ids), seq)
        input_ids = np.full(shape, packing.pad_id, np.int64)
        labels = np.full(shape, IGNORE, np.int64)
        positions = np.zeros(shape, np.int64)
        documents = np.full(shape, -1, np.int64)
        rows: list[int] = []
        cols = [0] * len(ids)
        for r, row, begin, end, _ in pieces:
            col = cols[r]
            stop = col + end - begin
            positions[r, col:stop] = np.arange(begin, end) if row not in bad else np.arange(end - begin)
            if row not in bad:
                doc = docs[row]
                input_ids[r, col:stop] = doc.ids[begin:end]
                targets = doc.targets[begin + 1 : end]
                labels[r, col + 1 : stop] = np.where(targets, input_ids[r, col + 1 : stop], IGNORE)
                documents[r, col:stop] = row
                rows.append(row)
            cols[r] = stop
        for r, col in enumerate(cols):
            if col < seq:  # the row's padding: a segment of its own
                positions[r, col:] = np.arange(seq - col)
        segments = _by_row(pieces, cols, seq)
        cu = np.zeros(len(segments) + 1, np.int32)
        np.cumsum(segments, out=cu[1:])
        keys, values = pixels
        fields = {"input_ids": input_ids, "labels": labels, "position_ids": positions, "document_index": documents,
                  "cu_seqlens": cu, "max_seqlen": int(max(segments)), "pixel_values": values,
                  "image_document_index": np.asarray([key[0] for key in keys], np.int64), SKIPPED: skipped}
        return np.asarray(rows, np.int64), fields

    def follow(self, ids: np.ndarray, epoch: int) -> None:
        plan = self.order.plan(epoch)
        rows = [row for _, row, _, _, _ in self._pieces(plan, ids)]
        self.reader.follow(np.asarray(rows, np.int64))


def _without(keys: list[Key], pixels: torch.Tensor, bad: set[int],
             ) -> tuple[list[Key], torch.Tensor]:
    """A chunk's images and pixels without those of the ``bad`` documents."""
    keep = [i for i, key in enumerate(keys) if key[0] not in bad]
    if len(keep) == len(keys):
        return keys, pixels
    return [keys[i] for i in keep], pixels[torch.as_tensor(keep, dtype=torch.long, device=pixels.device)]


def _by_row(pieces: list[Piece], cols: list[int], seq: int) -> list[int]:
    """The segments' lengths in row order: each row's pieces, then its padding (as token packs number them)."""
    per_row: list[list[int]] = [[] for _ in cols]
    for r, _, begin, end, _ in pieces:
        per_row[r].append(end - begin)
    return [n for r, parts in enumerate(per_row) for n in (*parts, *([seq - cols[r]] if cols[r] < seq else []))]


class ImageTextPlacement(TokenPlacement):
    """Token runs whose batches are image-text packs (:class:`ImageTextBatches`), a builder ``wrap`` may extend.

    Args:
        prefetch: batches a run makes ahead of the training loop.
        pad_id: the packing's padding id.
        per_image: positions each image takes.
        first_image: each row's first image ordinal.
        pixels: how images are decoded and transformed (its graph is built on first use, in the run's thread).
        wrap: adds fields to each batch (a Mix's ``dataset``), or ``None``.
    """

    def __init__(self, prefetch: int, pad_id: int, per_image: int, first_image: np.ndarray,
                 pixels: Callable[[], Pixels], wrap: Callable[[Any], Any] | None = None):
        super().__init__(prefetch, pad_id)
        self.per_image, self.first_image, self.wrap = per_image, first_image, wrap
        self.pixels = pixels()

    def _parts(self, parts: RunParts) -> TokenParts:
        order = parts.sampler
        if not isinstance(order, PackOrder):
            raise TypeError("image-text samples are packed: pass packing=stallfree.Packing(...)")
        build: Any = ImageTextBatches(order, parts.reader, self.per_image, self.first_image, self.pixels)
        if self.wrap is not None:
            build = self.wrap(build)
        return TokenParts(order, parts.config.batcher, build, self.prefetch)
