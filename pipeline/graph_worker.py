"""The graph process: a Loader's reader and DALI graph, in a process of their own (:mod:`.process_graph`).

It holds a :class:`~stallfree.pipeline.local_graph.LocalGraph` and makes the runs the training process asks for with
it, exactly as that process would have (the same stages, skip policy and runs started ahead), so the batches are the
same wherever the graph runs. Each run has a pump thread here that takes its batches in order, copies each batch's
images into a shared slot (:mod:`.batch_memory`) and sends the batch's description; it runs at most ``prefetch``
batches ahead of what the training process has taken. The run started ahead for the next epoch gets its pump at
once: its first batch is in a slot before the training process asks for the epoch, and goes out as soon as it
does. The stages' clock spans are sent as they happen, once the training process has given the run a clock
(``input`` is that process's own: the wait of its loop).

Messages, each a tuple whose first item names it. From the training process, as a list of those pending at once:
``("source", key, pickled (reader, transforms, RunConfig))``, ``("run", id, key, sampler, epoch, split, position,
number, skipped)``, ``("ahead", key, sampler, epoch)``, ``("discard",)``, ``("attach", id, on)``, ``("free",
slots)`` (slots past the board's) and ``("stop", id)``; what it took and freed goes on the board
(:class:`~.batch_memory.Board`), not in a message. To it: ``("ready", pid)`` then the board's descriptor, or
``("refused", reason)``, after the setup; ``("source", key, reason or None)``, ``("slot", slot, size)`` then the
slot's descriptor, ``("batch", id, number, start, end, rows as int64 bytes, skipped, the Layout's fields)``,
``("span", id, stage, state, start, end, batch)``, ``("next", id)`` (the run may start the next epoch's), ``("error",
id, pickled exception)`` and ``("done", id)``.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import traceback
from dataclasses import astuple
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from typing import Any

import numpy as np
import torch

from stallfree.ingest.fields import IMAGE
from stallfree.pipeline.batch_memory import Board, Slots
from stallfree.pipeline.local_graph import LocalGraph
from stallfree.pipeline.priority import lowered, run_at
from stallfree.pipeline.run import Run
from stallfree.pipeline.run_config import RunParts

__all__ = ["pickled_error", "serve"]


def pickled_error(err: BaseException) -> bytes:
    """``err`` pickled so that it unpickles as itself, else as a ``RuntimeError`` naming its type and message."""
    try:
        data = pickle.dumps(err)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - an exception whose class will not round-trip: its words still do
        return pickle.dumps(RuntimeError(f"{type(err).__name__}: {err}"))


def _reason(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


class _Channel:
    """The connection to the training process; messages from several threads, one at a time."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...], fd: int | None = None) -> bool:
        """Send ``message`` (then ``fd``'s descriptor); ``False`` once the training process has gone."""
        with self._lock:
            try:
                self.conn.send(message)
                if fd is not None:
                    send_handle(self.conn, fd, 0)
            except OSError:
                return False
        return True


class _Clock:
    """A run's clock here: each span sent to the training process (but ``input``, that process's own wait)."""

    def __init__(self, channel: _Channel, run_id: int):
        self.channel, self.run_id = channel, run_id

    def record(self, stage: str, state: str, start: float, end: float, batch: int | None = None) -> None:
        if stage != "input":  # perf_counter is CLOCK_MONOTONIC, the same clock in both processes
            self.channel.send(("span", self.run_id, stage, state, start, end, batch))


class _Served:
    """One run and its pump thread, which sends its batches at most ``window`` ahead of those taken.

    A run started ahead has no id until the training process asks for it (:meth:`bind`): its pump copies its first
    batch into a slot meanwhile, and sends nothing until then.
    """

    def __init__(self, server: _Server, run_id: int | None, run: Run, number: int, window: int):
        self.server, self.run_id, self.run, self.window = server, run_id, run, window
        self._taken = number  # the first batch not yet taken by the training process
        self._credit = threading.Condition()
        self._stopped = False
        nice = lowered()
        self.thread = threading.Thread(target=self._pump, args=(nice,), name="stallfree-pump", daemon=True)
        self.thread.start()
        run_at(nice, self.thread.native_id)  # holds once started, as the stages' threads do (priority.py)

    def bind(self, run_id: int) -> None:
        """The training process took this run (started ahead) as its run ``run_id``."""
        with self._credit:
            self.run_id = run_id
            self._credit.notify_all()

    def stop(self) -> None:
        with self._credit:
            self._stopped = True
            self._credit.notify_all()
        self.run.stop()

    def _room(self, number: int) -> bool:
        """Wait until batch ``number`` may be sent; ``False`` once the run is stopped.

        The training process says what it took on the board (no message): read every 0.5-4 ms while waiting, which
        the ``window`` batches already sent cover many times over.
        """
        pause = 0.0005
        while not self._stopped:
            taken = None if self.run_id is None else self.server.slots.board.taken(self.run_id)
            if taken is not None:
                self._taken = max(self._taken, taken)
            if number < self._taken + self.window:
                return True
            time.sleep(pause)
            pause = min(2 * pause, 0.004)
        return False

    def _taken_by(self) -> int | None:
        """The run's id once the training process has taken it; ``None`` once it is stopped first."""
        with self._credit:
            while self.run_id is None and not self._stopped:
                self._credit.wait(0.5)
            return None if self._stopped else self.run_id

    def _pump(self, nice: int | None) -> None:
        run_at(nice)  # below the training loop, as the stages are (priority.py)
        channel, slots = self.server.channel, self.server.slots
        try:
            for batch in self.run:
                if not self._room(batch.number):
                    return
                layout, fd = slots.put(batch.fields.pop(IMAGE.name))
                if fd is not None:
                    if not channel.send(("slot", layout.slot, layout.nbytes), fd):
                        return
                    slots.sent(fd)
                run_id = self._taken_by()
                if run_id is None:
                    slots.free([layout.slot])
                    return
                if self.run.may_start_next.is_set():
                    channel.send(("next", run_id))  # the training process sets an Event: again is harmless
                rows = np.ascontiguousarray(batch.rows, np.int64).tobytes()
                if not channel.send(("batch", run_id, batch.number, batch.start, batch.end, rows, batch.skipped,
                                     astuple(layout))):
                    return
        except BaseException as err:  # noqa: BLE001 - every failure reaches the training loop, none is lost
            run_id = self._taken_by()
            if run_id is not None:
                channel.send(("error", run_id, pickled_error(err)))
            return
        run_id = self._taken_by()
        if run_id is not None:
            if self.run.may_start_next.is_set():
                channel.send(("next", run_id))
            channel.send(("done", run_id))


class _Server:
    """The graph process's state: its graph, the run parts it was sent, its runs and their slots."""

    def __init__(self, conn: Connection, graph: LocalGraph, window: int, board: Board):
        self.channel, self.graph, self.window = _Channel(conn), graph, window
        self.sources: dict[str, tuple[Any, Any, Any]] = {}  # key: (reader, compiled transforms, RunConfig)
        self.runs: dict[int, _Served] = {}
        self.ahead: _Served | None = None  # the pump of the run started ahead, until it is taken or stopped
        self.slots = Slots(board)

    def _parts(self, key: str, sampler: Any) -> RunParts:
        reader, compiled, config = self.sources[key]
        return RunParts(config, sampler, reader, compiled)

    def handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "source":
            _, key, data = message
            try:
                self.sources[key] = pickle.loads(data)
                self.channel.send(("source", key, None))
            except Exception as err:  # noqa: BLE001 - the training process keeps the graph then (said there)
                self.channel.send(("source", key, _reason(err)))
        elif kind == "run":
            _, run_id, key, sampler, epoch, split, position, number, skipped = message
            ahead, self.ahead = self.ahead, None
            try:
                run = self.graph.run(self._parts(key, sampler), epoch, split, position, number, skipped)
            except BaseException as err:  # noqa: BLE001 - raised in the training loop
                self.channel.send(("error", run_id, pickled_error(err)))
                return
            if ahead is not None and ahead.run is run:
                ahead.bind(run_id)
                self.runs[run_id] = ahead
            else:  # the run started ahead, if any, was not the one asked for: the graph stopped it
                if ahead is not None:
                    ahead.stop()
                self.runs[run_id] = _Served(self, run_id, run, number, self.window)
        elif kind == "ahead":
            _, key, sampler, epoch = message
            self.graph.start_ahead(self._parts(key, sampler), epoch)
            if self.ahead is not None:
                self.ahead.stop()
            started = self.graph.ahead()
            self.ahead = None if started is None else _Served(self, None, started, 0, self.window)
        elif kind == "discard":
            self.graph.discard()
            if self.ahead is not None:
                self.ahead.stop()
                self.ahead = None
        elif kind == "attach":
            _, run_id, on = message
            if run_id in self.runs:
                self.runs[run_id].run.attach(_Clock(self.channel, run_id) if on else None)
        elif kind == "free":
            self.slots.free(message[1])
        elif kind == "stop":
            served = self.runs.pop(message[1], None)
            if served is not None:
                served.stop()

    def end(self) -> None:
        """The training process has gone: stop every run and the one started ahead."""
        for served in self.runs.values():
            served.stop()
        if self.ahead is not None:
            self.ahead.stop()
        self.graph.discard()


def serve(conn: Connection) -> None:
    """Serve one Loader's runs on ``conn`` until the training process closes it (run in a forked process)."""
    try:
        graph_keywords, window, environ = pickle.loads(conn.recv_bytes())
        os.environ.clear()  # the training process's environment now, not the fork server's at its start
        os.environ.update(environ)
        graph = LocalGraph(**graph_keywords)
    except Exception as err:  # noqa: BLE001 - the training process keeps the graph then, and says why
        conn.send(("refused", _reason(err)))
        return
    # The batch's copy into its slot on the pump's own thread: torch's parallel copy woke a pool of threads that spin
    # between batches, which took 15% of the cores from DALI's workers on 2 cores.
    torch.set_num_threads(1)
    board, fd = Board.create()
    conn.send(("ready", os.getpid()))
    send_handle(conn, fd, 0)
    os.close(fd)
    server = _Server(conn, graph, window, board)
    try:
        while True:
            try:
                messages = conn.recv()  # what the training process had pending, in order
            except (EOFError, OSError):
                return
            for message in messages:
                server.handle(message)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        server.end()
