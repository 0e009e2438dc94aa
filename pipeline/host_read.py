"""A sample read on the host before it enters the graph: fields fetched, image header checked, parameters drawn.

The one read path of an epoch run, whether the graph runs in this process (:mod:`.read_stage`) or on a Ray worker
(:mod:`.ray_take`): a failure here (a missing or unreadable file, a header that is not an image or claims too many
pixels) is a sample the skip policy (:mod:`.skips`) replaces. Crop windows and other random parameters are drawn on
the size the header gives, keyed by ``(seed, epoch, sample)`` (:mod:`stallfree.transforms.random`), so the pixels
are the same wherever the batch is made.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING

import numpy as np

from stallfree.ingest.fields import IMAGE
from stallfree.ingest.images import BadImage, read_header
from stallfree.pipeline.reader_base import sample_of
from stallfree.transforms.random import batch_random

if TYPE_CHECKING:
    from stallfree.pipeline.run_config import RunParts
    from stallfree.transforms.compile import CompiledTransforms

__all__ = ["HostRead", "Size"]

#: The (height, width) an image's parameters are drawn on.
Size = tuple[int, int]


class HostRead:
    """Reads rows of ``parts``' reader and checks them as the run's configuration says.

    ``compiled`` is the spec whose parameters :meth:`draw` draws (default: the parts'; a Ray worker's graph may run
    the spec up to its last ``Normalize``, :mod:`.ray_transfer`).
    """

    def __init__(self, parts: RunParts, compiled: CompiledTransforms | None = None):
        self.parts, self.config = parts, parts.config
        self.compiled = compiled if compiled is not None else parts.compiled

    def rows(self, pool: Executor, rows: Sequence[int]) -> Iterator[tuple[dict[str, np.ndarray], Size, str | None]]:
        """Each row's ``(fields, size, problem)``, in order, read on ``pool``; ``problem`` is ``None`` for a good one.

        ``fields`` are the sample's per-sample fields by name; ``size`` is its image's (the header's, after EXIF if
        applied), on which its parameters are drawn.
        """
        for fields, problem in pool.map(self._fetch, rows):
            size: Size = (0, 0)
            if problem is None and IMAGE.name in fields:
                try:
                    size = self._size(fields[IMAGE.name])
                except BadImage as bad:
                    problem = bad.reason
            yield fields, size, problem

    def draw(self, epoch: int, virtual: Sequence[int], sizes: Sequence[Size]) -> dict[str, list[np.ndarray]]:
        """The random parameters of the samples ``virtual`` (ids of the epoch's order) of these sizes."""
        return self.compiled.draw(batch_random(self.config.seed, epoch, list(virtual)), list(sizes))

    def _fetch(self, row: int) -> tuple[dict[str, np.ndarray], str | None]:
        try:
            return sample_of(self.parts.reader.read(int(row))), None
        except FileNotFoundError:
            return {}, "missing file"
        except OSError as err:
            return {}, f"unreadable: {err.strerror or err}"

    def _size(self, data: np.ndarray) -> Size:
        """The (height, width) the crop parameters are drawn on: the header's (after EXIF, if applied)."""
        if not self.config.encoded:
            return int(data.shape[0]), int(data.shape[1])
        header = read_header(data, self.config.max_pixels, exif=self.config.exif)
        return header.height, header.width
