"""Sample kinds, as the Loader builds each: its order, where its batches are made, and their public form.

A kind is a set of fields (:mod:`stallfree.ingest.fields`); a reader declares its kind by its fields, and the Loader
asks the kind for the three parts that differ (DESIGN.md, "Sample kinds"): the order its runs read (samples, or
packs of documents), the placement that makes its runs (a DALI graph for images; the token run for sequences),
and the assembly of a batch's fields into what the training loop takes. Everything else (the sampler's
permutation, the batcher, the pass and its cursor, resume) is the same for every kind.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from stallfree.ingest.fields import IMAGES, TOKENS
from stallfree.pipeline.assembly import ImageAssembly, TokenAssembly
from stallfree.pipeline.block_order import block_order
from stallfree.pipeline.image_text_pack import check_fit, packed_lengths
from stallfree.pipeline.image_text_run import ImageTextPlacement, pixels_of
from stallfree.pipeline.loader_sampler import LoaderMixSamples, LoaderOrder, LoaderPacks, LoaderSampler
from stallfree.pipeline.mix_reader import MixBatches, MixPlacement, MixReader
from stallfree.pipeline.placement import placement_for
from stallfree.pipeline.sampler import Sampler
from stallfree.pipeline.token_run import TokenPlacement

if TYPE_CHECKING:
    from stallfree.pipeline.assembly import Assembly
    from stallfree.pipeline.options import LoaderOptions
    from stallfree.pipeline.placement import Placement
    from stallfree.pipeline.reader_base import Reader

__all__ = ["ImageText", "Images", "Kind", "MixedImageText", "MixedTokens", "Tokens", "kind_of"]


class Kind(Protocol):
    """What the Loader builds differently for a sample kind."""

    name: str

    def check(self, options: LoaderOptions, reader: Reader) -> None:
        """Refuse, by name, an option that does not apply to this kind."""
        ...

    def orders(self, options: LoaderOptions, reader: Reader) -> Callable[..., LoaderOrder]:
        """What makes the order of a shard (from ``rank``, ``world_size``, ``owner``)."""
        ...

    def placement(self, options: LoaderOptions, encoded: bool) -> Callable[[], Placement]:
        """What makes the placement of the runs, in each process anew."""
        ...

    def assembly(self, options: LoaderOptions, reader: Reader) -> Callable[[Reader], Assembly]:
        """What makes a pass's assembly for a reader (``reader`` now; a forked copy's reopened one later)."""
        ...


class Images:
    """An image and its label: the graph decodes and transforms; ``(images, labels)`` out."""

    name = "images"

    def check(self, options: LoaderOptions, reader: Reader) -> None:
        options.decode.compiled.output_size  # noqa: B018 - the transforms must end at a fixed size (ValueError)
        if options.order.packing is not None:
            raise ValueError(f"packing= packs token sequences, but {reader.kind} gives images; drop packing=, or "
                             "pass a token source (`stallfree ingest --tokenizer`, docs/sequences.md)")

    def orders(self, options: LoaderOptions, reader: Reader) -> Callable[..., LoaderOrder]:
        order = options.order
        permute = block_order(reader, order.block_shards, order.seed, order.sample_echo) if order.shuffle == "block" \
            else None
        return functools.partial(LoaderSampler, num_rows=len(reader), shuffle=order.shuffle != "none", seed=order.seed,
                                 drop_last=bool(order.drop_last), echo=order.sample_echo, permute=permute)

    def placement(self, options: LoaderOptions, encoded: bool) -> Callable[[], Placement]:
        return placement_for(options, options.order.batch_size, encoded)

    def assembly(self, options: LoaderOptions, reader: Reader) -> Callable[[Reader], Assembly]:
        output = options.output
        return functools.partial(ImageAssembly, labels=reader.labels(), device=output.device,
                                 pin_memory=output.pin_memory, target_transform=output.target_transform,
                                 columns=output.columns)


class Tokens:
    """A document's tokens and its length: packed into rows (``packing=``) or padded per batch; a dict out."""

    name = "token sequences"

    def check(self, options: LoaderOptions, reader: Reader) -> None:
        refused = []
        if options.decode.compiled.steps:
            refused.append("transform=")
        if options.output.target_transform is not None:
            refused.append("target_transform=")
        if options.run.workers is not None:
            refused.append("workers=")
        if options.order.shuffle == "block":
            refused.append("shuffle='block'")
        if refused:
            raise ValueError(f"{', '.join(refused)} apply to images, but {reader.kind} gives token sequences; drop "
                             "them (docs/sequences.md)")
        if options.order.packing is not None and options.order.packing.train_on == "assistant":
            raise ValueError(f"Packing(train_on='assistant') keeps the assistant's tokens as targets, but "
                             f"{reader.kind} marks none (image-text shards do: `stallfree ingest --layout "
                             "conversations`); pass train_on='all'")

    def orders(self, options: LoaderOptions, reader: Reader) -> Callable[..., LoaderOrder]:
        order = options.order
        if order.packing is None:
            return Images().orders(options, reader)
        documents = Sampler(len(reader), 0, 1, shuffle=order.shuffle != "none", seed=order.seed,
                            echo=order.sample_echo)
        lengths = np.asarray(getattr(reader, "lengths")(), np.int64)  # noqa: B009 - a token reader's, by contract
        return functools.partial(LoaderPacks, documents, lengths, order.packing, order.batch_size,
                                 drop_last=bool(order.drop_last))

    def placement(self, options: LoaderOptions, encoded: bool) -> Callable[[], Placement]:
        packing = options.order.packing
        return functools.partial(TokenPlacement, options.run.prefetch, packing.pad_id if packing is not None else 0)

    def assembly(self, options: LoaderOptions, reader: Reader) -> Callable[[Reader], Assembly]:
        output = options.output
        return functools.partial(TokenAssembly, device=output.device, pin_memory=output.pin_memory,
                                 columns=output.columns)


class MixedTokens(Tokens):
    """A :class:`~stallfree.pipeline.mix.Mix` of token sources: its order packed or padded, each token's ``dataset``.

    Args:
        mix: the Mix's reader (its sources, their sizes and quotas).
    """

    name = "a mixture of token sequences"

    def __init__(self, mix: MixReader):
        self.mix = mix

    def check(self, options: LoaderOptions, reader: Reader) -> None:
        super().check(options, reader)
        self.check_echo(options)

    def check_echo(self, options: LoaderOptions) -> None:
        """Refuse example echo: the Mix's weights repeat documents."""
        if options.order.sample_echo > 1:
            raise ValueError(f"echo={options.order.echo} (echo_mode='example') repeats documents, which a Mix's "
                             "weights already do: raise a source's weight or the Mix's epoch_size instead")

    def orders(self, options: LoaderOptions, reader: Reader) -> Callable[..., LoaderOrder]:
        order = options.order
        documents = self.mix.order(order.shuffle != "none", order.seed)
        if order.packing is None:
            return functools.partial(LoaderMixSamples, documents, drop_last=bool(order.drop_last))
        return functools.partial(LoaderPacks, documents, self.mix.lengths(), order.packing, order.batch_size,
                                 drop_last=bool(order.drop_last))

    def placement(self, options: LoaderOptions, encoded: bool) -> Callable[[], Placement]:
        packing = options.order.packing
        pad_id = packing.pad_id if packing is not None else 0
        return functools.partial(MixPlacement, options.run.prefetch, pad_id, self.mix.offsets)


class ImageText(Tokens):
    """Documents of text and images: packed (``Packing(image_tokens=, image_token_id=)``), images through the graph.

    Each image stands for ``image_tokens`` positions of its row (:mod:`.image_text_pack`); the batch's images are
    decoded and transformed in the Loader's DALI graph, keyed by ``(seed, epoch, image ordinal)``
    (:mod:`.image_text_run`); a dict out, with ``pixel_values`` and ``image_document_index``.
    """

    name = "image-text samples"

    def __init__(self, reader: Reader):
        self._reader = reader  # the placement's image counts: each image's ordinal over the dataset

    def check(self, options: LoaderOptions, reader: Reader) -> None:
        refused = [name for name, given in (("target_transform=", options.output.target_transform is not None),
                                            ("workers=", options.run.workers is not None),
                                            ("shuffle='block'", options.order.shuffle == "block")) if given]
        if refused:
            raise ValueError(f"{', '.join(refused)} do not apply to {self.name} ({reader.kind}); drop them "
                             "(docs/sequences.md, \"Image-text samples\")")
        if options.order.packing is None:
            raise ValueError(f"{reader.kind} gives {self.name}, which are packed: pass packing=stallfree.Packing("
                             "seq_len=S, image_tokens=N, image_token_id=ID) (docs/sequences.md)")
        options.decode.compiled.output_size  # noqa: B018 - the transforms must end at a fixed size (ValueError)
        self.per_image(options)

    @staticmethod
    def per_image(options: LoaderOptions) -> int:
        """Positions each image takes: ``image_tokens`` of the transforms' fixed output size."""
        packing = options.order.packing
        if packing is None:
            raise ValueError("image-text samples are packed: pass packing=stallfree.Packing(...)")
        return packing.tokens_per_image(options.decode.compiled.output_size)

    def counts(self, reader: Reader) -> np.ndarray:
        """Every row's image count."""
        return np.asarray(getattr(reader, "image_counts")(), np.int64)  # noqa: B009 - an image-text reader's

    def documents(self, options: LoaderOptions, reader: Reader) -> Any:
        """The documents' order over the whole job."""
        order = options.order
        return Sampler(len(reader), 0, 1, shuffle=order.shuffle != "none", seed=order.seed, echo=order.sample_echo)

    def orders(self, options: LoaderOptions, reader: Reader) -> Callable[..., LoaderOrder]:
        order, counts = options.order, self.counts(reader)
        assert order.packing is not None  # check() refused packing=None
        lengths = np.asarray(getattr(reader, "lengths")(), np.int64)  # noqa: B009 - a token reader's, by contract
        packed = packed_lengths(lengths, counts, self.per_image(options))
        check_fit(packed, counts, order.packing, reader.describe)
        return functools.partial(LoaderPacks, self.documents(options, reader), packed, order.packing,
                                 order.batch_size, drop_last=bool(order.drop_last), images=counts)

    def placement(self, options: LoaderOptions, encoded: bool) -> Callable[[], Placement]:
        packing = options.order.packing
        assert packing is not None  # check() refused packing=None
        counts = self.counts(self._reader)
        first = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=first[1:])
        return functools.partial(ImageTextPlacement, options.run.prefetch, packing.pad_id, self.per_image(options),
                                 first, functools.partial(pixels_of, options), self.wrap())

    def wrap(self) -> Callable[[Any], Any] | None:
        """What adds a batch's further fields (a Mix's ``dataset``), or ``None``."""
        return None


class MixedImageText(ImageText):
    """A :class:`~stallfree.pipeline.mix.Mix` with image-text sources: image and text-only documents in one pack."""

    name = "a mixture of image-text and token sequences"

    def __init__(self, mix: MixReader):
        super().__init__(mix)  # type: ignore[arg-type] # a MixReader is a Reader (its fields a tuple)
        self.mix = mix

    def check(self, options: LoaderOptions, reader: Reader) -> None:
        super().check(options, reader)
        MixedTokens(self.mix).check_echo(options)

    def counts(self, reader: Reader) -> np.ndarray:
        return self.mix.image_counts()

    def documents(self, options: LoaderOptions, reader: Reader) -> Any:
        return self.mix.order(options.order.shuffle != "none", options.order.seed)

    def wrap(self) -> Callable[[Any], Any] | None:
        return functools.partial(MixBatches, offsets=self.mix.offsets)


def kind_of(reader: Reader) -> Kind:
    """The reader's sample kind, by its fields."""
    if isinstance(reader, MixReader):
        return MixedImageText(reader) if reader.has_images else MixedTokens(reader)
    fields = getattr(reader, "fields", ())
    if any(field.kind == IMAGES.kind for field in fields):
        return ImageText(reader)
    if any(field.kind == TOKENS.kind for field in fields):
        return Tokens()
    return Images()
