"""The fork server: a process that has imported the graph process's modules and forks one for each Loader.

One per training process; each Loader whose graph runs in a process of its own asks it for one
(:mod:`.process_graph`).

Starting a Python process that imports torch and DALI takes 2-3 s on 2 cores; forking one that already has takes
milliseconds. The server is started with exec (``python -m stallfree.pipeline.fork_main``) as soon as a Loader is
built, so its imports overlap the job's own start; it is never forked from the training process, so it holds none
of that process's threads or locks. It runs no user code: the training script is not run again in it, so no
``if __name__ == "__main__":`` is needed (multiprocessing's ``spawn`` and ``forkserver`` import the main module again
in each child). It has one thread when it forks. It ends when the training process does (its connection closes),
and each graph process ends when its Loader's connection closes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle

__all__ = ["ForkServer", "server"]

_START_S = 120.0  # seconds the server may take to import its modules


class ForkServer:
    """The training process's side of the fork server: started at once, waited for on the first :meth:`fork`."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self._conn = Connection(ours.detach())
        self._ready = False
        self._lock = threading.Lock()
        path = [entry or os.getcwd() for entry in sys.path]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}  # stallfree and the user's modules, as here
        self.process = subprocess.Popen([sys.executable, "-m", "stallfree.pipeline.fork_main", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()

    def fork(self) -> Connection:
        """A connection to a new graph process (:func:`stallfree.pipeline.graph_worker.serve` runs in it).

        Raises:
            OSError: the server could not start or has ended.
        """
        with self._lock:
            if not self._ready:
                if not self._conn.poll(_START_S):
                    raise OSError(f"the Loader's fork server (process {self.process.pid}) did not start in "
                                  f"{_START_S:.0f} s")
                try:
                    self._conn.recv()
                except EOFError:
                    raise OSError(f"the Loader's fork server (process {self.process.pid}) ended as it started, "
                                  f"exit code {self.process.wait()}") from None
                self._ready = True
            ours, theirs = socket.socketpair()
            try:
                self._conn.send("fork")
                send_handle(self._conn, theirs.fileno(), self.process.pid)
            except OSError as err:
                raise OSError(f"the Loader's fork server (process {self.process.pid}) has ended: {err}") from err
            finally:
                theirs.close()
        return Connection(ours.detach())


_SERVER: tuple[int, ForkServer] | None = None
_SERVER_LOCK = threading.Lock()


def server() -> ForkServer:
    """This process's fork server, started on first use (anew in a forked child: the parent's is the parent's)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None or _SERVER[0] != os.getpid():
            _SERVER = os.getpid(), ForkServer()
        return _SERVER[1]
