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

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stallfree.pipeline.loader import Loader
    from stallfree.pipeline.passes import Pass

__all__ = ["LOCAL", "copied", "forked"]

#: The Loader's attributes that belong to its process (made anew by ``Loader._local``).
LOCAL = ("_graph", "_pass", "_progress", "_next", "_discard", "_pid")

#: The parent's graphs, runs and readers in a forked child: held, so that no destructor of theirs runs here (DALI's
#: would wait for threads that exist only in the parent).
_LEFT_BEHIND: list[Any] = []


def _standing(loader: Loader, ongoing: Pass | None) -> dict[str, Any]:
    """The fields that make ``loader`` stand where its pass ``ongoing`` stands, as a loaded state would."""
    if ongoing is None or not ongoing.progress.taken:
        return {}  # no pass, or one that delivered nothing: the Loader stands where that pass started
    state = loader._state_at(ongoing.cursor, True)
    return {"_start": ongoing.cursor, "_loaded": True, "_loaded_raw": state, "skipped": list(loader.skipped)}


def copied(loader: Loader) -> dict[str, Any]:
    """What a pickled or deep-copied ``loader`` carries (its ``__getstate__``).

    Raises:
        TypeError: it has Ray ``workers``.
    """
    if loader.workers is not None:
        raise TypeError("a Loader with workers=RayWorkers(...) cannot be pickled or copied: its Ray actors belong to "
                        "this process's connection; build the Loader where it is used")
    ongoing = loader._current()
    fields = {name: value for name, value in vars(loader).items() if name not in LOCAL}
    return {**fields, **_standing(loader, ongoing)}


def forked(loader: Loader, ongoing: Pass | None) -> None:
    """``loader`` is a forked child's copy: take it off the parent's graph, threads and pass (module docstring).

    Args:
        loader: the child's Loader.
        ongoing: the pass that was in progress in the parent at the fork, if any.

    Raises:
        RuntimeError: its source is remote, or it has Ray workers: it cannot be used in the child.
    """
    parent = loader._pid
    if loader.workers is not None or getattr(loader.reader, "read_ahead", None) is not None:  # threads of its own
        source = loader.reader.name or loader.reader.kind
        what = "Ray workers" if loader.workers is not None else f"remote source {source}"
        raise RuntimeError(f"this Loader was built in process {parent} and is used in process {os.getpid()}, a fork "
                           f"of it; its {what} (connections, downloads and a cache folder) belong to process "
                           f"{parent}: build a new Loader in this process (with a cache_dir of its own), or start "
                           "this process with multiprocessing's 'spawn' and pass it the Loader pickled")
    _LEFT_BEHIND.append((loader._graph, loader._next, loader._discard, ongoing, loader.reader))
    loader._discard.detach()
    standing = _standing(loader, ongoing)
    loader._local()
    vars(loader).update(standing)
    loader.reader = loader.reader.reopened()
