"""Where the Loader's graph runs when it runs on Ray: :class:`RayWorkers`, the cluster, and the actors.

``Loader(..., workers=RayWorkers(num_workers=N, cpus_per_worker=C))`` keeps the sampler in the Loader's process
and runs decode and augmentation in N Ray actors of C CPUs each, with DALI's CPU operators (docs/ray.md). Ray is
the engine: actors, ``ray.get``/``ray.wait``, its object store; nothing here is a cluster, an RPC or a scheduler of
its own. ``ray`` is imported only when a Ray-backed pass starts (the ``stallfree[ray]`` extra).
"""

from __future__ import annotations

import os
import uuid
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stallfree.core.ray_cluster import connect

if TYPE_CHECKING:
    from stallfree.pipeline.run_config import RunParts
    from stallfree.transforms.compile import CompiledTransforms

__all__ = ["RayWorkers"]

Transfer = Literal["output", "uint8"]


@dataclass(frozen=True)
class RayWorkers:
    """Run the Loader's graph in ``num_workers`` Ray actors of ``cpus_per_worker`` CPUs each.

    Args:
        num_workers: actors (each holds the reader, reopened where it runs, and a DALI CPU graph).
        cpus_per_worker: CPUs Ray reserves for each actor; also its DALI threads.
        address: the cluster (``"HOST:PORT"``, ``"ray://..."``, ``"auto"``). Used only when this process is not
            connected to one already (``ray.init`` called); else ``RAY_ADDRESS``; else a local cluster is started
            as ``ray.init()`` does.
        transfer: what crosses the network per batch: ``"output"`` (the Loader's own output: its dtype and layout;
            bit-identical to the local Loader) or ``"uint8"`` (the image before a trailing ``Normalize`` and the
            float conversion, which the Loader's process then does: a quarter of float32's bytes; equal to
            ``"output"`` when ``dtype="uint8"``, else within a step of one uint8 level; docs/ray.md).
        in_flight: batches each actor may hold (queued or running); bounds the driver's memory (backpressure).

    The actors are created on the first pass and kept for the Loaders that use this object; :meth:`close` ends them.
    """

    num_workers: int = 1
    cpus_per_worker: int = 1
    address: str | None = None
    transfer: Transfer = "output"
    in_flight: int = 2
    _pool: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("num_workers", "cpus_per_worker", "in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RayWorkers {name} must be an int >= 1, got {value!r}")
        if self.transfer not in ("output", "uint8"):
            raise ValueError(f"RayWorkers transfer must be 'output' or 'uint8', got {self.transfer!r}")
        if self.address is not None and not isinstance(self.address, str):
            raise TypeError(f"RayWorkers address must be a string 'HOST:PORT' or None, got {self.address!r}")

    def pool(self) -> WorkerPool:
        """The actors, created on first use (this connects to the cluster)."""
        pool: WorkerPool | None = self._pool.get("pool")
        if pool is None:
            pool = self._pool["pool"] = WorkerPool(self, connect(self.address, who="RayWorkers")[0])
        return pool

    def forget(self) -> None:
        """Drop the actors without ending them (their cluster went away; a later pass connects again)."""
        self._pool.pop("pool", None)

    def close(self) -> None:
        """End the actors (a later pass creates new ones)."""
        pool = self._pool.pop("pool", None)
        if pool is not None:
            pool.close()


class GraphWorker:
    """The actor: takes batches (:class:`~stallfree.pipeline.ray_take.BatchTaker`) for the Loaders that prepared it."""

    def __init__(self) -> None:
        self._takers: dict[str, Any] = {}
        self._failed: dict[str, Exception] = {}  # a setup that failed: its takes raise its error

    def pid(self) -> int:
        """The actor's process id (a test kills it to check that its batches are redone)."""
        return os.getpid()

    def cpu_seconds(self) -> float:
        """CPU seconds the actor's process has used (``stallfree bench ray`` reads the workers' cost)."""
        from stallfree.core.cpu import cpu_seconds

        return cpu_seconds()

    def prepare(self, key: str, parts: RunParts, compiled: CompiledTransforms, num_threads: int) -> None:
        """Build the reader and graph of the Loader run ``key`` (once; the four latest are kept)."""
        from stallfree.pipeline.ray_take import BatchTaker

        if key in self._takers:
            return
        while len(self._takers) >= 4:
            self._takers.pop(next(iter(self._takers))).close()
        try:
            self._takers[key] = BatchTaker(parts, compiled, num_threads)
        except Exception as err:  # noqa: BLE001 - raised by every take of this run, where the driver waits
            self._failed[key] = err

    def take(self, key: str, *args: Any) -> Any:
        """One batch of the run ``key`` (:meth:`BatchTaker.take`'s arguments)."""
        if key in self._failed:
            raise self._failed[key]
        return self._takers[key].take(*args)


class WorkerPool:
    """``num_workers`` actors on the cluster at ``address``; an actor that died is replaced in its slot."""

    def __init__(self, workers: RayWorkers, address: str):
        import ray

        self.workers, self.address = workers, address
        wanted, total = workers.num_workers * workers.cpus_per_worker, ray.cluster_resources().get("CPU", 0)
        if wanted > total:
            warnings.warn(f"RayWorkers wants {workers.num_workers} x {workers.cpus_per_worker} = {wanted} CPUs but the "
                          f"cluster at {address} has {total:g}: the actors that do not fit wait until it grows (an "
                          "autoscaler), and with them the batches sent to them; use fewer workers or CPUs per worker",
                          UserWarning, stacklevel=4)
        # Ray's stubs type an actor's methods as plain functions; handles are Any here
        self._remote: Any = ray.remote(GraphWorker).options(num_cpus=workers.cpus_per_worker, max_restarts=0)
        self.actors: list[Any] = [self._remote.remote() for _ in range(workers.num_workers)]
        self._prepared: list[set[str]] = [set() for _ in self.actors]

    def replace(self, slot: int) -> None:
        """A new actor in ``slot`` (the old one died or is killed)."""
        import ray

        try:
            ray.kill(self.actors[slot])
        except Exception:  # noqa: BLE001 - it may be gone already: the new actor is what matters
            pass
        self.actors[slot] = self._remote.remote()
        self._prepared[slot] = set()

    def submit(self, slot: int, key: str, setup: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
        """Run ``take`` of run ``key`` on the actor in ``slot`` (preparing it first if needed); its object ref."""
        actor = self.actors[slot]
        if key not in self._prepared[slot]:
            actor.prepare.remote(key, *setup)  # an actor runs one caller's calls in order: before the take
            self._prepared[slot].add(key)
        return actor.take.remote(key, *args)

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            for actor in self.actors:
                try:
                    ray.kill(actor)
                except Exception:  # noqa: BLE001 - an actor already gone needs no ending
                    continue
        self.actors = []


def run_key() -> str:
    """A key for one Loader's worker setup (its parts and spec), unique across processes."""
    return uuid.uuid4().hex
