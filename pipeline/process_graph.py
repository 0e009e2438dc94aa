"""The graph and its reader in a process of their own, so that the training loop's Python never waits for theirs.

In one process the Loader's reader, its read threads and its graph stage run Python under the interpreter's lock
(the GIL). A training loop also holds that lock for much of its step (launching kernels, the optimizer, logging), so
each waited for the other: the loop's own Python ran 17-150% slower beside the Loader than alone (issue 49,
``stallfree bench stall``). torch's DataLoader keeps its workers in other processes for this reason. Here the
training process keeps the order, the cursor, the state and the public batch (:mod:`.passes`, :mod:`.epochs`); the
graph process (:mod:`.graph_worker`, forked by :mod:`.forkserver`) makes the runs, with the same stages and the same
skip policy, and writes each batch's images into shared memory (:mod:`.batch_memory`). Taking a batch costs the loop
one small message and a tensor made over memory already mapped, whatever the batch's size.

It is where the Loader's graph runs when the batches are delivered on the CPU and the source is local, on Linux
(memfd and descriptor passing). Elsewhere the graph stays in this process (:class:`~.local_graph.LocalGraph`):

- ``device="cuda"``: the graph decodes on the GPU, and the batch stays there; a CUDA tensor cannot be handed to
  another process without CUDA IPC and the producer keeping each batch alive until the consumer frees it, which is
  not built. The Python left in the training process is the graph stage's feeding and the hand-off.
- ``pin_memory=True``: page-locked memory is this process's to allocate.
- a remote source (its downloads and shard cache belong to this process), and Ray ``workers`` (their own processes).
- a source or transform that does not pickle, or whose classes the graph process cannot import (defined in the
  training script's ``__main__``): said in a warning, with what to do.
- ``STALLFREE_GRAPH_PROCESS=0`` in the environment, for a debugger or profiler that must see the graph's threads.

The graph process's threads run 10 nice steps below the thread that iterates the Loader (:mod:`.priority`), as the
Loader's threads in this process do; Linux's ``SCHED_IDLE`` class and nice 19 were measured and refused
(docs/loader.md, "The training loop's cores and its GIL"): they starve the Loader beside any busy process.

The batches, skips, states and clock spans are the same in every case (tests/pipeline/test_process_graph.py).
If the graph process dies (killed, out of memory), the pass raises a ``RuntimeError`` that says so, and, as after any
failed pass, ``load_state_dict`` of the last state taken goes on from there; the next pass starts a new graph process.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import pickle
import select
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle
from typing import TYPE_CHECKING, Any

import numpy as np

from stallfree.ingest.fields import IMAGE
from stallfree.pipeline import forkserver
from stallfree.pipeline.batch_memory import Board, Layout, Mapped
from stallfree.pipeline.local_graph import LocalGraph
from stallfree.pipeline.samples import Batch

if TYPE_CHECKING:
    from stallfree.pipeline.run import Clock, Run
    from stallfree.pipeline.run_config import RunParts

__all__ = ["ProcessGraph", "ProcessRun", "in_process"]

_ENV = "STALLFREE_GRAPH_PROCESS"


def in_process() -> str | None:
    """Why the graph cannot have a process of its own on this system (``None``: it can)."""
    if sys.platform != "linux" or not hasattr(os, "memfd_create"):
        return "the graph process needs Linux (memfd and descriptor passing)"
    if os.environ.get(_ENV, "1") == "0":
        return f"{_ENV}=0"
    return None


class _Refused(Exception):
    """The graph process cannot serve this Loader (the reason is the message)."""


class _Worker:
    """The training process's side of one graph process: what it sends, and the messages it gets for each run.

    Only the thread that waits for a batch reads the connection (no thread of the Loader's runs here to take the
    GIL from the loop); whatever it reads for another run goes to that run's inbox. Sends from any thread, a
    finalizer's included, go through :meth:`post`: never two at once, and never one inside another.
    """

    def __init__(self, conn: Connection, pid: int, board: Board):
        self.conn, self.pid = conn, pid
        self.mapped = Mapped(board)
        self.gone: str | None = None
        self._outbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._runs: dict[int, weakref.ref[ProcessRun]] = {}
        self._ids = itertools.count()
        self._readable = select.poll()
        self._readable.register(conn.fileno(), select.POLLIN)
        # Each source sent, by key (its pickle's digest): what was sent (kept, so that the identities stay valid) and,
        # once the graph process answered, None (it has it) or why it could not load it.
        self._sources: dict[str, tuple[Any, Any, Any]] = {}
        self._loaded: dict[str, str | None] = {}
        weakref.finalize(self, conn.close)  # the graph process ends when its connection closes

    @classmethod
    def start(cls, keywords: dict[str, Any], window: int) -> _Worker:
        """A new graph process for a graph built with ``keywords``, sending at most ``window`` batches ahead."""
        try:
            setup = pickle.dumps((keywords, window, dict(os.environ)))
        except Exception as err:  # noqa: BLE001 - the graph stays in this process, said in a warning
            raise _Refused(f"its transforms do not pickle ({type(err).__name__}: {err})") from err
        try:
            conn = forkserver.server().fork()
            conn.send_bytes(setup)
            reply = conn.recv()
            if reply[0] != "ready":
                conn.close()
                raise _Refused(f"the graph process could not load its transforms ({reply[1]})")
            board = Board.attach(recv_handle(conn))
        except (OSError, EOFError) as err:
            raise _Refused(f"no graph process could be started ({type(err).__name__}: {err})") from err
        return cls(conn, reply[1], board)

    # --- sending ---

    def post(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` after those posted before it (now, or by the thread sending already)."""
        self._outbox.append(message)
        self.flush()

    def flush(self) -> None:
        """Send the freed slots and the messages posted, unless another send is under way (it sends them).

        What is pending goes as one list, in one write. Taking a batch sends nothing: the board says it.
        """
        while self._outbox:  # freed slots past the board's wait for the next message
            if not self._send_lock.acquire(blocking=False):
                return
            try:
                released, outbox = self.mapped.released, self._outbox
                pending: list[tuple[Any, ...]] = []
                if released:
                    pending.append(("free", [released.popleft() for _ in range(len(released))]))
                pending.extend(outbox.popleft() for _ in range(len(outbox)))
                self.conn.send(pending)
            except OSError as err:
                self.gone = self.gone or f"{type(err).__name__}: {err}"
                self._outbox.clear()
                self.mapped.released.clear()
                return
            finally:
                self._send_lock.release()

    # --- receiving ---

    def receive_until(self, done: Callable[[], bool], stopped: Callable[[], bool]) -> None:
        """Read and hand out messages until ``done()`` (or ``stopped()``).

        Raises:
            RuntimeError: the graph process has ended.
        """
        while not done():
            with self._recv_lock:
                if done():
                    return
                self.flush()
                if self.gone is not None:
                    raise self._ended()
                if not self._readable.poll(100):  # Connection.poll builds a selector on every call
                    if stopped():
                        return
                    continue
                try:
                    message = self.conn.recv()
                except (EOFError, OSError) as err:
                    self.gone = self.gone or f"{type(err).__name__}: {err}"
                    raise self._ended() from None
                self._dispatch(message)

    def _ended(self) -> RuntimeError:
        return RuntimeError(f"the Loader's graph process {self.pid} ended unexpectedly (killed, or out of memory?): "
                            f"{self.gone}; load the last state_dict() taken and iterate the Loader to go on from "
                            "there (a new graph process starts)")

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "slot":
            self.mapped.add(message[1], recv_handle(self.conn), message[2])
            return
        if kind == "source":
            self._loaded[message[1]] = message[2]
            return
        ref = self._runs.get(message[1])
        run = ref() if ref is not None else None
        if run is not None:
            run.receive(message)
        elif kind == "batch":  # a run dropped or stopped: its batch is nobody's
            self.mapped.free(message[-1][0])

    # --- runs ---

    def source(self, parts: RunParts) -> str:
        """The key the graph process knows ``parts``' reader, transforms and settings by, sent once (and waited for).

        Each pass makes new parts around the same reader: only their order (small) goes with each run.

        Raises:
            _Refused: they do not pickle, or the graph process cannot load them.
        """
        held = (parts.reader, parts.compiled, parts.config)
        key = next((k for k, (reader, compiled, config) in self._sources.items()
                    if reader is held[0] and compiled is held[1] and config == held[2]), None)
        if key is None:
            try:
                data = pickle.dumps(held)
            except Exception as err:  # noqa: BLE001 - the graph stays in this process, said in a warning
                raise _Refused(f"its source does not pickle ({type(err).__name__}: {err})") from err
            key = hashlib.sha1(data).hexdigest()
            self._sources[key] = held
            self.post(("source", key, data))
        self.receive_until(lambda: key in self._loaded, lambda: False)
        reason = self._loaded[key]
        if reason is not None:
            raise _Refused(f"the graph process could not load its source ({reason})")
        return key

    def run(self, key: str, parts: RunParts, epoch: int, split: int, position: int, number: int,
            skipped: list[dict[str, Any]]) -> ProcessRun:
        run_id = next(self._ids)
        run = ProcessRun(self, run_id)
        self._runs[run_id] = weakref.ref(run)
        self.post(("run", run_id, key, parts.sampler, epoch, split, position, number, list(skipped)))
        return run

    def forget(self, run_id: int) -> None:
        self._runs.pop(run_id, None)


class ProcessRun:
    """The batches of a run made in the graph process, in order (a :class:`~stallfree.pipeline.run.Run`)."""

    def __init__(self, worker: _Worker, run_id: int):
        self.worker, self.run_id = worker, run_id
        self.may_start_next = threading.Event()
        self._inbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._clock: Clock | None = None
        self._stopped = False
        weakref.finalize(self, worker.forget, run_id)

    def receive(self, message: tuple[Any, ...]) -> None:
        """A message for this run, read by whichever thread was reading."""
        kind = message[0]
        if kind == "span":
            if self._clock is not None:
                self._clock.record(*message[2:])
        elif kind == "next":
            self.may_start_next.set()
        elif kind == "batch" and self._stopped:
            self.worker.mapped.free(message[-1][0])
        else:
            self._inbox.append(message)

    def attach(self, clock: Clock | None) -> None:
        self._clock = clock
        self.worker.post(("attach", self.run_id, clock is not None))

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        while self._inbox:
            message = self._inbox.popleft()
            if message[0] == "batch":
                self.worker.mapped.free(message[-1][0])
        self.worker.post(("stop", self.run_id))

    def join(self, timeout: float) -> None:
        """Nothing of the run's runs in this process (its threads are the graph process's)."""

    def ready(self) -> bool:
        self.worker.receive_until(lambda: bool(self._inbox) or not self.worker.conn.poll(0), lambda: True)
        return bool(self._inbox)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def __iter__(self) -> Iterator[Batch]:
        worker = self.worker
        while not self._stopped:
            wait_start = time.perf_counter()
            worker.receive_until(lambda: bool(self._inbox), lambda: self._stopped)
            if not self._inbox:
                return
            message = self._inbox.popleft()
            if message[0] == "done":
                return
            if message[0] == "error":
                raise pickle.loads(message[2])
            _, _, number, start, end, rows, skipped, layout = message
            rows = np.frombuffer(rows, np.int64).copy()  # sent as bytes: a numpy array unpickles 10x slower
            images = worker.mapped.tensor(Layout(*layout))
            if self._clock is not None:
                self._clock.record("input", "waiting", wait_start, time.perf_counter(), number)
            worker.mapped.board.take(self.run_id, number + 1)  # no message: the graph process reads the board
            yield Batch(number, start, end, rows, skipped, {IMAGE.name: images})


class ProcessGraph:
    """The graph in a graph process of its own (the module docstring), or in this one where it cannot be.

    Args:
        prefetch: batches the graph process may send ahead of those the loop has taken.
        graph: the graph's keywords (:class:`~stallfree.pipeline.graph.Graph`).
    """

    def __init__(self, *, prefetch: int, **graph: Any):
        self._keywords, self._window = graph, max(1, prefetch)
        self._worker: _Worker | None = None
        self._local: LocalGraph | None = None
        forkserver.server()  # started now: its imports overlap the job's own start

    def _placed(self, parts: RunParts) -> tuple[_Worker, str] | LocalGraph:
        """Where ``parts``' runs are made: the graph process (and their key there), or this process."""
        if self._local is not None:
            return self._local
        if getattr(parts.reader, "read_ahead", None) is not None:  # its downloads and shard cache are this process's
            self._local = LocalGraph(**self._keywords)
            return self._local
        try:
            if self._worker is None or self._worker.gone is not None:
                self._worker = _Worker.start(self._keywords, self._window)
            return self._worker, self._worker.source(parts)
        except _Refused as why:
            warnings.warn(f"the Loader's graph runs in the training process: {why}. Define the source's and "
                          "transforms' classes and functions in a module the script imports (not in the script "
                          "itself) so that they load in a process of their own (docs/loader.md, \"The training "
                          "loop's cores and its GIL\")", RuntimeWarning, stacklevel=6)  # the user's `for`
            self._local = LocalGraph(**self._keywords)
            return self._local

    def run(self, parts: RunParts, epoch: int, split: int, position: int, number: int,
            skipped: list[dict[str, Any]]) -> Run:
        placed = self._placed(parts)
        if isinstance(placed, LocalGraph):
            return placed.run(parts, epoch, split, position, number, skipped)
        worker, key = placed
        return worker.run(key, parts, epoch, split, position, number, skipped)

    def start_ahead(self, parts: RunParts, epoch: int) -> None:
        placed = self._placed(parts)
        if isinstance(placed, LocalGraph):
            placed.start_ahead(parts, epoch)
        else:
            placed[0].post(("ahead", placed[1], parts.sampler, epoch))

    def discard(self) -> None:
        if self._local is not None:
            self._local.discard()
        elif self._worker is not None:
            self._worker.post(("discard",))
