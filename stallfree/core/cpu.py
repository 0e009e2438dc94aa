"""The one CPU-seconds meter: what the benchmarks divide by wall time to say how many cores a contender kept busy.

A process's user and system seconds, with those of its descendants: living ones (a DataLoader's workers, a server's
helpers, the Loader's graph processes under its fork server) are read directly, and those that ended count through
their parent's ``children_*`` times, which take them over once they are reaped, so a difference taken over a pass
counts each process once.
"""

from __future__ import annotations

__all__ = ["cpu_seconds"]


def cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds used so far by process ``pid`` (default: this one), its threads and its child processes.

    Raises:
        psutil.NoSuchProcess: ``pid`` is not running.
    """
    import psutil  # here, not at import: the floor every command imports stays light

    process = psutil.Process(pid)
    times = process.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in process.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.Error:  # it ended between the listing and the reading: counted once reaped
            continue
        # with the children it reaped: a Loader's fork server reaps its graph processes (pipeline/forkserver.py)
        total += child_times.user + child_times.system + child_times.children_user + child_times.children_system
    return float(total)
