"""The skip policy: what ``on_error`` does with a sample that cannot go in, wherever the graph runs.

Every ``on_error`` decision of an epoch run is made here, for the local run (:mod:`.epoch`) and for a batch taken on
a Ray worker (:mod:`.ray_take`) alike, so that both skip the same samples, record them the same way and give up at
the same point:

- ``on_error="raise"``: a sample that fails its host check (a missing file, a bad header) or fails in the graph is a
  :class:`~stallfree.pipeline.samples.BadSampleError` naming its file (or shard row) and the reason.
- ``on_error="skip"``: it is recorded (``{"index", "source", "reason", "epoch", "position"}``: the Loader's
  ``skipped``, and what a state carries), its position of the rank's stream is marked bad for the rest of the
  epoch, and the run takes the next samples in its place. Once every position is bad the run fails naming the
  first skip: there is nothing left to fill a batch with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stallfree.pipeline.samples import BadSampleError

if TYPE_CHECKING:
    from stallfree.pipeline.graph import GraphError
    from stallfree.pipeline.reader_base import Reader

__all__ = ["SkipPolicy", "SkipRecord"]

#: One skipped sample: ``index`` (its row), ``source`` (its file or shard row), ``reason``, ``epoch``, ``position``.
SkipRecord = dict[str, Any]


class SkipPolicy:
    """``on_error`` over one epoch's stream of ``length`` positions, starting from the ``skipped`` records so far.

    Attributes:
        bad: the stream's positions (modulo ``length``) known bad this epoch.
        first: the epoch's first skip record (named when every sample is skipped).
    """

    def __init__(self, on_error: Literal["raise", "skip"], reader: Reader, epoch: int, length: int,
                 skipped: Sequence[SkipRecord] = ()):
        self.on_error, self.reader, self.epoch, self.length = on_error, reader, epoch, length
        self.bad = {int(s["position"]) % length for s in skipped}
        self.first: SkipRecord | None = skipped[0] if skipped else None

    def record(self, position: int, row: int, reason: str) -> SkipRecord:
        """The record of the sample at ``position`` (row ``row``) failing for ``reason``.

        Raises:
            BadSampleError: under ``on_error="raise"``.
        """
        source = self.reader.describe(row)
        if self.on_error == "raise":
            raise BadSampleError(source, row, reason)
        return {"index": row, "source": source, "reason": reason, "epoch": self.epoch, "position": position}

    def note(self, record: SkipRecord) -> None:
        """Mark ``record``'s position bad for the epoch; raise once no position is left (:meth:`check_left`)."""
        self.bad.add(int(record["position"]) % self.length)
        self.first = self.first or record
        self.check_left()

    def skip(self, position: int, row: int, reason: str) -> SkipRecord:
        """:meth:`record` then :meth:`note`: the sample is skipped, and its record returned."""
        record = self.record(position, row, reason)
        self.note(record)
        return record

    def is_bad(self, position: int) -> bool:
        """Whether ``position`` of the stream is known bad this epoch."""
        return position % self.length in self.bad

    def check_left(self) -> None:
        """Raise once every position of the epoch is skipped: no sample is left to fill a batch with."""
        first = self.first
        if len(self.bad) >= self.length and first is not None:
            raise RuntimeError(
                f"every sample of this rank's epoch was skipped ({self.length} samples; the first: "
                f"{first['source']}: {first['reason']}); check the data, or the transforms if every sample fails "
                "in the graph"
            )

    def graph_failure(self, failure: GraphError, positions: Sequence[int], rows: Sequence[int] | np.ndarray,
                      ) -> list[SkipRecord]:
        """The records of the samples (at ``positions``, rows ``rows``) that failed the graph on their own.

        Each is noted bad (:meth:`note`), in the order DALI found them.

        Raises:
            BadSampleError: under ``on_error="raise"``, or when no sample fails on its own (the graph, not the
                data, fails: the batch's first sample is named).
        """
        if not failure.bad or self.on_error == "raise":
            row = int(rows[failure.bad[0] if failure.bad else 0])
            reason = failure.reasons[0] if failure.bad else str(failure)
            raise BadSampleError(self.reader.describe(row), row, f"decoding failed: {reason}") from failure
        records = []
        for i, reason in zip(failure.bad, failure.reasons, strict=True):
            records.append(self.skip(int(positions[i]), int(rows[i]), f"decoding failed: {reason}"))
        return records
