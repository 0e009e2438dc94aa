"""The graph in this process: one DALI graph, built on first use, shared by every run; runs started ahead.

The next epoch's run is started ahead by :mod:`.next_pass`. The graph process (:mod:`.graph_worker`) holds one too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stallfree.pipeline.epoch import EpochRun
from stallfree.pipeline.graph import Graph
from stallfree.pipeline.next_pass import NextPass
from stallfree.pipeline.priority import on_lowered_thread

if TYPE_CHECKING:
    from stallfree.pipeline.run import Run
    from stallfree.pipeline.run_config import RunParts

__all__ = ["LocalGraph"]


class LocalGraph:
    """The graph in this process: one DALI graph, built on first use, shared by every run; runs started ahead.

    Args:
        graph: the graph's keywords (:class:`~stallfree.pipeline.graph.Graph`).
    """

    def __init__(self, **graph: Any):
        self._keywords = graph
        self._graph: Graph | None = None
        self._next = NextPass()  # the next epoch's run, started once a pass's reader has read its epoch

    @property
    def built(self) -> bool:
        """Whether the graph exists yet (a pass or :meth:`start_ahead` built it)."""
        return self._graph is not None

    def graph(self) -> Graph:
        """The DALI graph every run shares, built on first use (so that building a Loader stays cheap)."""
        if self._graph is None:  # built on a thread of lowered priority, which DALI's workers inherit (priority.py)
            self._graph = on_lowered_thread(lambda: Graph(**self._keywords))
        return self._graph

    def run(self, parts: RunParts, epoch: int, split: int, position: int, number: int,
            skipped: list[dict[str, Any]]) -> Run:
        ahead = self._next.take(epoch, split, position, number, skipped, parts)
        return ahead or EpochRun(parts, self.graph(), epoch, split, position, number, skipped)

    def start_ahead(self, parts: RunParts, epoch: int) -> None:
        self._next.start(parts, self.graph(), epoch)

    def ahead(self) -> EpochRun | None:
        """The run started ahead, if one is waiting to be taken."""
        return self._next.waiting()

    def discard(self) -> None:
        self._next.discard()
