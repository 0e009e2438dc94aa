"""A Loader beyond the process that made it: pickled, deep-copied, or carried into a forked child.

Besides its configuration, a Loader holds what lives only in its process: the DALI graph and its threads, the pass
in progress and its threads, the next epoch's run started ahead, and a reader's open files and locks. None of it
travels (torch's DataLoader says as much of its worker processes); the configuration and the position do:

- **pickle, deepcopy**: a copy is the configuration and where the Loader stands, as :meth:`Loader.state_dict`
  says it (taken mid-pass: after the last batch delivered); it makes its graph and threads on its first pass, in
  the process it lands in (a ``spawn`` child of ``multiprocessing``), and decides its rank there. Its source,
  transforms, ``target_transform`` and ``clock`` must pickle. A Loader with Ray ``workers`` is refused.
- **os.fork**: the child's Loader sees at its next call that it is in another process, leaves the parent's graph,
  threads, pass and reader as they are (never stopped or freed there: their threads did not come with the fork,
  and a lock one of them held is held for ever), reopens a reader that holds files or locks, and goes on from
  where it stood at the fork with a graph of its own. The parent's iterator raises in the child. A remote source
  (downloads, and a shard cache whose folder the parent holds) and Ray workers cannot be carried: the child gets a
  ``RuntimeError`` at once saying what to do.
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

from stallfree.pipeline.placement import RayGraph

if TYPE_CHECKING:
    from stallfree.pipeline.epochs import Epochs, Standing
    from stallfree.pipeline.passes import Pass

__all__ = ["LOCAL", "copied", "forked"]

#: The attributes of a Loader's :class:`~stallfree.pipeline.epochs.Epochs` that belong to its process (made anew by
#: ``Epochs.local``).
LOCAL = ("placement", "_pass", "_progress", "_discard", "pid")

#: The parent's graphs, runs and readers in a forked child: held, so that no destructor of theirs runs here (DALI's
#: would wait for threads that exist only in the parent).
_LEFT_BEHIND: list[Any] = []


def _standing(epochs: Epochs, ongoing: Pass | None) -> Standing:
    """Where a copy of ``epochs`` stands: where its pass ``ongoing`` stands, as a loaded state would put it."""
    standing = copy.copy(epochs.standing)
    standing.skipped = list(standing.skipped)
    if ongoing is None or not ongoing.progress.taken:
        return standing  # no pass, or one that delivered nothing: the Loader stands where that pass started
    standing.raw = epochs.state_at(ongoing.cursor, True)
    standing.start, standing.loaded = ongoing.cursor, True
    return standing


def copied(epochs: Epochs) -> dict[str, Any]:
    """What a pickled or deep-copied Loader's passes carry (``Epochs.__getstate__``).

    Raises:
        TypeError: its graph runs on Ray workers.
    """
    if isinstance(epochs.placement, RayGraph):
        raise TypeError("a Loader with workers=RayWorkers(...) cannot be pickled or copied: its Ray actors belong to "
                        "this process's connection; build the Loader where it is used")
    ongoing = epochs.current()
    fields = {name: value for name, value in vars(epochs).items() if name not in LOCAL}
    return {**fields, "standing": _standing(epochs, ongoing)}


def forked(epochs: Epochs, ongoing: Pass | None) -> None:
    """``epochs`` is a forked child's copy: take it off the parent's graph, threads and pass (module docstring).

    Raises:
        RuntimeError: its source is remote, or its graph runs on Ray workers: it cannot be used in the child.
    """
    parent, reader = epochs.pid, epochs.reader
    ray = isinstance(epochs.placement, RayGraph)
    if ray or getattr(reader, "read_ahead", None) is not None:  # threads of its own
        what = "Ray workers" if ray else f"remote source {getattr(reader, 'name', '') or reader.kind}"
        raise RuntimeError(f"this Loader was built in process {parent} and is used in process {os.getpid()}, a fork "
                           f"of it; its {what} (connections, downloads and a cache folder) belong to process "
                           f"{parent}: build a new Loader in this process (with a cache_dir of its own), or start "
                           "this process with multiprocessing's 'spawn' and pass it the Loader pickled")
    _LEFT_BEHIND.append((epochs.placement, epochs._discard, ongoing, reader))
    epochs._discard.detach()
    standing = _standing(epochs, ongoing)
    epochs._pass = None
    epochs.local()
    epochs.standing = standing
    reopened = getattr(reader, "reopened", None)
    epochs.reader = reopened() if callable(reopened) else reader
