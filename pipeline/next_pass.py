"""The next epoch's run, started while the training loop still takes the last batches of this one.

A pass's threads stop producing once its last batch is queued, and a new ``iter()`` used to start from empty
queues: every epoch began with a wait for the first read and the first graph run, which on a small dataset (or a
fast device) is a visible share of the step. Once a pass's reader has read its epoch (its last chunk is queued
for the graph), the Loader starts the run the next ``iter()`` will most likely ask for (the next epoch from its
start, nothing skipped yet), and ``iter()`` takes it when it asks for exactly that. Its reads overlap the last
batches of this pass in the graph, and the graph's lock makes its graph stage wait until this pass's last batch
is out: the two runs never share the graph. It used to start only once the graph had queued the last batch, and a
training loop that took each batch as it came (faster than the graph) took the last one before that was seen, so
the next epoch was not started ahead at all (issue 36: its first batch waited 59-70 ms). Anything else
(``set_epoch`` to another epoch, ``load_state_dict`` elsewhere) stops it and starts afresh; the batches are the
same either way, since every draw is keyed by (seed, epoch, sample).

The run holds the Loader's parts, not the Loader, so a Loader dropped after its last pass is freed at once; its
finalizer stops the run and waits for its threads (no read of a shard outlives the Loader). A run nobody takes
also stops by itself after :data:`IDLE_S`, through its own threads: a timer thread used to hold it, and when the
timer was cancelled at the end of the program it could drop the run's last queued batch while the interpreter was
shutting down, which aborts the process ("terminate called without an active exception").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stallfree.pipeline.epoch import EpochRun

if TYPE_CHECKING:
    from stallfree.pipeline.graph import Graph
    from stallfree.pipeline.run_config import RunParts

__all__ = ["IDLE_S", "NextPass"]

IDLE_S = 20.0
_JOIN_S = 30.0  # a stopped run's graph thread finishes the batch it is on (then frees the graph's lock)


class NextPass:
    """At most one run started ahead for ``(epoch, split 0, position 0, batch 0)`` with nothing skipped."""

    def __init__(self) -> None:
        self._run: EpochRun | None = None

    def start(self, parts: RunParts, graph: Graph, epoch: int) -> None:
        """Start ``epoch``'s run from its beginning; its graph stage waits for ``graph``'s lock (the pass before's)."""
        self.discard()
        self._run = EpochRun(parts, graph, epoch, 0, 0, 0, skipped=[], idle_s=IDLE_S)

    def take(self, epoch: int, split: int, position: int, number: int, skipped: list[dict[str, Any]],
             parts: RunParts | None = None) -> EpochRun | None:
        """The run started ahead if it is the one asked for and still running; else ``None`` (and it is stopped).

        ``parts`` are the Loader's now: a run started with other settings, or for another rank (one started before
        the process group was made), is not the one asked for. The pass that takes it gives it its clock
        (:meth:`EpochRun.attach`), whichever clock that is.
        """
        run, self._run = self._run, None
        if run is None:
            return None
        run.taken()  # first, so that it cannot stop for idleness once it is found running
        other = parts is None or run.config != parts.config or (
            run.parts.sampler.rank, run.parts.sampler.world_size) != (parts.sampler.rank, parts.sampler.world_size)
        if other or run.stopped or skipped or run.epoch != epoch or run.start != (split, position, number):
            _stop(run)
            return None
        return run

    def waiting(self) -> EpochRun | None:
        """The run started ahead, not taken yet (``None`` if there is none)."""
        return self._run

    def discard(self) -> None:
        """Stop a run started ahead, if any, and wait until it no longer uses the graph."""
        self.take(-1, -1, -1, -1, [])


def _stop(run: EpochRun) -> None:
    run.stop()
    run.join(_JOIN_S)
