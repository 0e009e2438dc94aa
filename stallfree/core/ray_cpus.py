"""A Ray cluster's CPUs, as a wait for them is reported: how many, on which nodes, how many free, who holds them.

Ray queues an actor or a task that asks for more CPUs than are free, silently and for as long as it takes (a cluster
started by ``ray.init`` never grows). What stallfree says while it waits, and when it stops waiting, comes from here:
the alive nodes' CPUs and ``ray.available_resources()`` (Ray's public API), and who holds the CPUs from the cluster's
actor table, read from its GCS (Ray has no public reader of it that works without the dashboard, so a cluster whose
table cannot be read is reported as such, never guessed at).

``ray`` is imported inside the functions: it is an extra (``stallfree[ray]``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

__all__ = ["ClusterCpus", "Holder", "cluster_cpus"]


@dataclass(frozen=True)
class Holder:
    """``actors`` alive actors of class ``name``, started by ``driver``, holding ``cpus`` CPUs between them."""

    name: str
    driver: str  # "this process (pid 12)", "the driver pid 34 on 10.0.0.5", or "a detached owner"
    actors: int
    cpus: float
    own: bool  # started by this process


@dataclass(frozen=True)
class ClusterCpus:
    """The cluster's CPUs: ``total``, ``free``, each alive node's, and who holds those that are taken."""

    total: float
    free: float
    nodes: tuple[float, ...]
    holders: tuple[Holder, ...]
    unread: str | None = None  # why the holders could not be read (then ``holders`` is empty)

    @property
    def largest(self) -> float:
        """The most CPUs one node has (what one actor or task can ask for)."""
        return max(self.nodes, default=0.0)

    def held_by(self) -> str:
        """Who holds the taken CPUs, largest share first ("3 GraphWorker actors of this process (pid 12) hold 3")."""
        if self.unread is not None:
            return f"who holds them is not known ({self.unread})"
        parts = [f"{h.actors} {h.name} actor{'s' if h.actors > 1 else ''} of {h.driver} "
                 f"hold{'s' if h.actors == 1 else ''} {_n(h.cpus)}" for h in sorted(self.holders, key=_largest_first)]
        rest = self.total - self.free - sum(h.cpus for h in self.holders)
        if rest > 1e-9:
            parts.append(f"tasks or placement groups hold {_n(rest)}")
        return "; ".join(parts) if parts else "none is taken"

    def describe(self) -> str:
        """``"0 of 3 CPUs free (nodes of 1 and 2 CPUs): 3 GraphWorker actors of this process (pid 12) hold 3"``."""
        sizes = " and ".join(_n(n) for n in sorted(self.nodes)) if self.nodes else "none alive"
        plural = "s" if len(self.nodes) != 1 else ""
        return f"{_n(self.free)} of {_n(self.total)} CPUs free (node{plural} of {sizes} CPUs): {self.held_by()}"


def cluster_cpus(*, holders: bool = True) -> ClusterCpus:
    """The connected cluster's CPUs now (this process is a driver of it: ``ray.init`` called).

    Args:
        holders: whether to read who holds the taken CPUs (else ``unread`` says they were not asked for).
    """
    import ray

    nodes = tuple(float(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n["Alive"])
    total = float(ray.cluster_resources().get("CPU", 0))
    free = float(ray.available_resources().get("CPU", 0))  # the key is absent when none is free
    if not holders:
        return ClusterCpus(total, free, nodes, (), unread="not asked for")
    try:
        return ClusterCpus(total, free, nodes, _holders(ray))
    except Exception as err:  # noqa: BLE001 - Ray's private table reader moved or failed: the report says so
        return ClusterCpus(total, free, nodes, (), unread=f"{type(err).__name__}: {err}")


def _holders(ray: Any) -> tuple[Holder, ...]:
    """The alive actors that hold CPUs, grouped by class and driver, from the GCS's actor table."""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    table: Any = gcs_pb2.ActorTableData  # type: ignore[attr-defined]  # generated protobuf: no stubs for its classes
    accessor = state._connect_and_get_accessor()  # the table `ray list actors` reads through the dashboard
    own_job = ray.get_runtime_context().get_job_id()
    drivers = {job["JobID"]: (job["DriverPid"], job["DriverIPAddress"]) for job in state.job_table()}
    count: Counter[tuple[str, str]] = Counter()
    cpus: dict[tuple[str, str], float] = {}
    for raw in accessor.get_actor_table(None, "ALIVE"):
        actor = table.FromString(raw)
        held = float(actor.required_resources.get("CPU", 0))
        if held > 0:
            key = (str(actor.class_name), actor.job_id.hex())
            count[key] += 1
            cpus[key] = cpus.get(key, 0.0) + held
    out = []
    for (name, job), actors in count.items():
        pid, host = drivers.get(job, (None, ""))
        own = job == own_job
        driver = (f"this process (pid {pid})" if own else f"the driver pid {pid} on {host}" if pid is not None
                  else f"job {job}")
        out.append(Holder(name, driver, actors, cpus[(name, job)], own))
    return tuple(out)


def _largest_first(holder: Holder) -> float:
    return -holder.cpus


def _n(cpus: float) -> str:
    return f"{cpus:g}"
