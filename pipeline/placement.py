"""Where the Loader's graph runs: in a process of its own, in this process, or on Ray actors.

The placements: :class:`~.process_graph.ProcessGraph` (a graph process), :class:`~.local_graph.LocalGraph` (this
process) and :class:`RayGraph` (Ray actors).

Both make a pass's :class:`~stallfree.pipeline.run.Run` from the same parts and cursor, so the batches, skips and
states are the same wherever the work runs (DESIGN.md, "One path, many placements"); the Loader asks its placement
for runs and knows no more of either.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from stallfree.pipeline.local_graph import LocalGraph
from stallfree.pipeline.process_graph import ProcessGraph, in_process
from stallfree.pipeline.ray_run import RayRun
from stallfree.pipeline.ray_transfer import worker_spec
from stallfree.pipeline.ray_workers import RayWorkers, run_key

if TYPE_CHECKING:
    from stallfree.pipeline.options import LoaderOptions
    from stallfree.pipeline.run import Run
    from stallfree.pipeline.run_config import RunParts

__all__ = ["Placement", "RayGraph", "placement_for"]


class Placement(Protocol):
    """Makes a pass's runs."""

    def run(self, parts: RunParts, epoch: int, split: int, position: int, number: int,
            skipped: list[dict[str, Any]]) -> Run:
        """The run of ``epoch`` (split from ``split``) from stream ``position``, batch ``number``."""
        ...

    def start_ahead(self, parts: RunParts, epoch: int) -> None:
        """Start ``epoch``'s run from its beginning now, for a later :meth:`run` to take (where that helps)."""
        ...

    def discard(self) -> None:
        """Stop a run started ahead, if any."""
        ...


class RayGraph:
    """The graph on ``workers``' Ray actors (their CPU operators); batches come back to this process, in order."""

    def __init__(self, workers: RayWorkers, compiled: Any, pin_memory: bool):
        self.workers, self.pin_memory = workers, pin_memory
        self._spec = worker_spec(compiled, workers.transfer)
        self._id = run_key()  # names this Loader's setup on the actors

    def run(self, parts: RunParts, epoch: int, split: int, position: int, number: int,
            skipped: list[dict[str, Any]]) -> Run:
        compiled, finish = self._spec
        setup = (parts, compiled, self.workers.cpus_per_worker)
        key = f"{self._id}:{hash(parts.config)}"
        return RayRun(parts, self.workers.pool(), (key, setup), finish, epoch, split, position, number, skipped,
                      pin_memory=self.pin_memory)

    def start_ahead(self, parts: RunParts, epoch: int) -> None:
        """Nothing: the actors start their batches when the pass sends them."""

    def discard(self) -> None:
        """Nothing started ahead."""


def placement_for(options: LoaderOptions, batch_size: int, encoded: bool) -> Callable[[], Placement]:
    """What makes the graph's placement, in each process anew: a graph process, this process's graph, or Ray workers."""
    workers = options.run.workers
    if workers is not None:
        return functools.partial(RayGraph, workers, options.decode.compiled, options.output.pin_memory)
    decode, output = options.decode, options.output
    graph = {"compiled": decode.compiled, "batch_size": batch_size, "num_threads": options.run.threads,
             "device_id": options.graph_device, "encoded": encoded, "seed": options.order.seed, "exif": decode.exif,
             "pin_memory": output.pin_memory}
    if output.device.type == "cpu" and not output.pin_memory and in_process() is None:  # process_graph.py
        return functools.partial(ProcessGraph, prefetch=options.run.prefetch, **graph)
    return functools.partial(LocalGraph, **graph)
