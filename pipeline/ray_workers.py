"""Where the Loader's graph runs when it runs on Ray: :class:`RayWorkers`, the cluster, and the actors.

``Loader(..., workers=RayWorkers(num_workers=N, cpus_per_worker=C))`` keeps the sampler in the Loader's process
and runs decode and augmentation in N Ray actors of C CPUs each, with DALI's CPU operators (docs/ray.md). Ray is
the engine: actors, ``ray.get``/``ray.wait``, its object store; nothing here is a cluster, an RPC or a scheduler of
its own. ``ray`` is imported only when a Ray-backed pass starts (the ``stallfree[ray]`` extra).
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stallfree.core.cpu import cpu_seconds
from stallfree.core.ray_cluster import connect
from stallfree.core.ray_cpus import cluster_cpus

if TYPE_CHECKING:
    from stallfree.pipeline.ray_take import BatchTaker
    from stallfree.pipeline.run_config import RunParts
    from stallfree.transforms.compile import CompiledTransforms

__all__ = ["RayWorkers"]

Transfer = Literal["output", "uint8"]

_log = logging.getLogger(__name__)

_SAY_AFTER_S = 3.0  # an actor not started by then waits for CPUs (a start takes about a second): say what for
_KEPT = 4  # Loader setups (reader + graph) an actor keeps; the pool mirrors its choice of which to drop


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
        start_timeout: seconds to wait for the actors to start (for free CPUs on the cluster) before giving up with
            a ``TimeoutError`` naming the CPUs asked, those free and who holds them; ``None`` waits without end (a
            cluster whose autoscaler adds nodes slowly). After 3 s of waiting a warning says what is waited for.

    The actors are created on the first pass and kept for every Loader given this object: Loaders that share one
    ``RayWorkers`` share its actors (a training and a validation Loader need no CPUs of their own); each actor keeps
    the setups of the 4 latest Loaders and builds an older one again when it comes back. :meth:`close` ends them.
    """

    num_workers: int = 1
    cpus_per_worker: int = 1
    address: str | None = None
    transfer: Transfer = "output"
    in_flight: int = 2
    start_timeout: float | None = 60.0
    _pool: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("num_workers", "cpus_per_worker", "in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RayWorkers {name} must be an int >= 1, got {value!r}")
        if self.transfer not in ("output", "uint8"):
            raise ValueError(f"RayWorkers transfer must be 'output' or 'uint8', got {self.transfer!r}")
        timeout = self.start_timeout
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise ValueError(f"RayWorkers start_timeout must be seconds > 0 or None (no bound), got {timeout!r}")
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
        # Each Loader run's setup in the order prepared: its BatchTaker, or the error its setup raised (which every
        # take of the run raises, where the driver waits). The pool keeps the same keys in the same order.
        self._takers: dict[str, BatchTaker | Exception] = {}

    def pid(self) -> int:
        """The actor's process id (a test kills it to check that its batches are redone)."""
        return os.getpid()

    def cpu_seconds(self) -> float:
        """CPU seconds the actor's process has used (``stallfree bench ray`` reads the workers' cost)."""
        return cpu_seconds()

    def prepare(self, key: str, parts: RunParts, compiled: CompiledTransforms, num_threads: int) -> None:
        """Build the reader and graph of the Loader run ``key`` (once; the :data:`_KEPT` latest are kept)."""
        from stallfree.pipeline.ray_take import BatchTaker  # DALI, an extra: `stallfree.RayWorkers` needs none

        if key in self._takers:
            return
        while len(self._takers) >= _KEPT:
            dropped = self._takers.pop(next(iter(self._takers)))
            if not isinstance(dropped, Exception):
                dropped.close()
        try:
            self._takers[key] = BatchTaker(parts, compiled, num_threads)
        except Exception as err:  # noqa: BLE001 - raised by every take of this run, where the driver waits
            self._takers[key] = err

    def take(self, key: str, *args: Any) -> Any:
        """One batch of the run ``key`` (:meth:`BatchTaker.take`'s arguments)."""
        taker = self._takers[key]
        if isinstance(taker, Exception):
            raise taker
        return taker.take(*args)


class WorkerPool:
    """``num_workers`` actors on the cluster at ``address``; an actor that died is replaced in its slot.

    Raises:
        TimeoutError: the actors did not start within ``start_timeout`` (no free CPUs for them); it names the CPUs
            asked, those free and who holds them.
    """

    def __init__(self, workers: RayWorkers, address: str):
        import ray

        self.workers, self.address = workers, address
        cpus = cluster_cpus(holders=False)
        shortfall = _shortfall(workers, cpus.total, cpus.largest)
        if shortfall:
            warnings.warn(f"RayWorkers wants {_asked(workers)} but the cluster at {address} {shortfall}: the actors "
                          f"that do not fit wait until it grows (an autoscaler), and fail after start_timeout="
                          f"{workers.start_timeout}; use fewer workers or CPUs per worker", UserWarning, stacklevel=4)
        # Ray's stubs type an actor's methods as plain functions; handles are Any here
        self._remote: Any = ray.remote(GraphWorker).options(num_cpus=workers.cpus_per_worker, max_restarts=0)
        self.actors: list[Any] = [self._remote.remote() for _ in range(workers.num_workers)]
        self._prepared: list[dict[str, None]] = [{} for _ in self.actors]  # each actor's setups, in its order
        try:
            self._started(range(len(self.actors)))
        except BaseException:
            self.close()
            raise

    def _started(self, slots: range | list[int]) -> None:
        """Wait until the actors in ``slots`` run; say what is waited for after a few seconds, give up after a bound.

        Ray queues an actor that finds no free CPUs without a word, for as long as it takes: the warning comes after
        :data:`_SAY_AFTER_S`, the ``TimeoutError`` after ``start_timeout``.
        """
        import ray

        waiting = {self.actors[slot].pid.remote(): slot for slot in slots}
        bound = self.workers.start_timeout
        began = time.monotonic()
        deadline, say_at = began + (bound if bound is not None else math.inf), began + _SAY_AFTER_S
        while waiting:
            until = min(deadline, say_at)
            timeout = None if until == math.inf else max(0.0, until - time.monotonic())
            ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=timeout)
            for ref in ready:  # started, or died starting: a dead actor's takes fail and it is replaced (RayRun)
                del waiting[ref]
            now = time.monotonic()
            if waiting and now >= deadline:
                raise TimeoutError(f"RayWorkers could not start {self._pending(waiting)} within start_timeout="
                                   f"{bound:g} s: {self._cpus()}; {_FIX}")
            if waiting and now >= say_at:
                say_at = math.inf
                end = f"{bound:g} s" if bound is not None else "None (never)"
                _log.warning("RayWorkers waits for %s to start (%.0f s so far): %s; it gives up after start_timeout="
                             "%s", self._pending(waiting), now - began, self._cpus(), end)

    def _pending(self, waiting: dict[Any, int]) -> str:
        workers = self.workers
        which = (f"{len(waiting)} of its {workers.num_workers} actors" if workers.num_workers > 1 else "its actor")
        return f"{which} ({_asked(workers)}) on the Ray cluster at {self.address}"

    def _cpus(self) -> str:
        cpus = cluster_cpus()
        shortfall = _shortfall(self.workers, cpus.total, cpus.largest)
        return f"the cluster has {cpus.describe()}" + (f"; it {shortfall}" if shortfall else "")

    def replace(self, slot: int) -> None:
        """A new actor in ``slot`` (the old one died or is killed), waited for as the first ones were."""
        import ray

        try:
            ray.kill(self.actors[slot])
        except Exception:  # noqa: BLE001 - it may be gone already: the new actor is what matters
            pass
        self.actors[slot] = self._remote.remote()
        self._prepared[slot] = {}
        self._started([slot])

    def submit(self, slot: int, key: str, setup: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
        """Run ``take`` of run ``key`` on the actor in ``slot`` (preparing it first if needed); its object ref."""
        actor = self.actors[slot]
        prepared = self._prepared[slot]
        if key not in prepared:
            actor.prepare.remote(key, *setup)  # an actor runs one caller's calls in order: before the take
            while len(prepared) >= _KEPT:  # the setup the actor drops to make room (GraphWorker.prepare)
                del prepared[next(iter(prepared))]
            prepared[key] = None
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


def _asked(workers: RayWorkers) -> str:
    n, c = workers.num_workers, workers.cpus_per_worker
    return f"{n} x {c} = {n * c} CPUs" if n > 1 else f"{c} CPU{'s' if c > 1 else ''}"


def _shortfall(workers: RayWorkers, total: float, largest: float) -> str:
    """What the cluster lacks for ``workers`` whoever holds its CPUs ("" when they fit on it idle)."""
    lacks = []
    if workers.num_workers * workers.cpus_per_worker > total:
        lacks.append(f"has {total:g} CPUs in all")
    if workers.cpus_per_worker > largest:
        lacks.append(f"has no node of {workers.cpus_per_worker} CPUs for a worker (the largest has {largest:g})")
    return " and ".join(lacks)


_FIX = ("give every Loader the same RayWorkers object (they share its actors), or close() the RayWorkers that holds "
        "the CPUs; or ask for fewer workers or CPUs per worker; or raise start_timeout for a cluster that grows (an "
        "autoscaler)")


def run_key() -> str:
    """A key for one Loader's worker setup (its parts and spec), unique across processes."""
    return uuid.uuid4().hex
