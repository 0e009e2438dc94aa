"""What an epoch run is built from: a frozen configuration and the parts it uses, never the Loader.

The stages of a run (:mod:`.read_stage`, :mod:`.graph_stage`, and :mod:`.epoch` around them) read the Loader's
settings from :class:`RunConfig` and use the sampler, the reader, the compiled transforms and the graph they are
given (:class:`RunParts`), so that a stage can be built from picklable inputs in another process (a Ray worker) and
give the same batches: every draw is keyed by ``(seed, epoch, sample)``, none by where the work runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from stallfree.ingest.images import Exif
from stallfree.pipeline.batcher import CountBatcher

if TYPE_CHECKING:
    from stallfree.pipeline.readers import Reader
    from stallfree.pipeline.sampler import Order
    from stallfree.transforms.compile import CompiledTransforms

__all__ = ["RunConfig", "RunParts"]


@dataclass(frozen=True)
class RunConfig:
    """The Loader's settings an epoch run reads (see :class:`~stallfree.pipeline.loader.Loader` for each).

    ``batcher`` says what a batch is (:mod:`.batcher`); ``encoded``: the reader gives encoded bytes (decoded in the
    graph) rather than HWC pixels.
    """

    batcher: CountBatcher
    seed: int
    prefetch: int
    io_threads: int
    on_error: Literal["raise", "skip"]
    max_pixels: int
    exif: Exif
    encoded: bool
    device: torch.device


@dataclass(frozen=True, eq=False)
class RunParts:
    """The objects a run uses: the order (``sampler``), the rows (``reader``) and the spec.

    No clock: a run reports its spans to the clock of the pass that takes it
    (:meth:`~stallfree.pipeline.run.Run.attach`).
    """

    config: RunConfig
    sampler: Order
    reader: Reader
    compiled: CompiledTransforms
