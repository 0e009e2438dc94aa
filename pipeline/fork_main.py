"""The fork server's own process (``python -m stallfree.pipeline.fork_main FD``): :mod:`.forkserver` starts it.

It imports the graph process's modules and the Loader's once, then forks a graph process (:mod:`.graph_worker`) for
each request on its connection, until the training process closes it. Nothing imports this module: it is only run.
"""

from __future__ import annotations

import os
import signal
import sys
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle

# The graph process's modules, and the Loader's (every reader's: a source then unpickles without an import, 120 ms of
# each Loader's first batch otherwise).
from stallfree.pipeline import graph_worker, loader  # noqa: F401

__all__: list[str] = []


def _reap(*_: object) -> None:
    """Reap the graph processes that ended: waited for, not ignored, so that their CPU time stays counted.

    A waited-for child's CPU time becomes the server's children's, which ``stallfree.core.cpu.cpu_seconds`` reads.
    """
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _serve(fd: int) -> None:
    """The server's loop: fork a graph process for each request, until the connection closes."""
    conn = Connection(fd)
    signal.signal(signal.SIGCHLD, _reap)
    conn.send("ready")
    while True:
        try:
            conn.recv()
            child = recv_handle(conn)
        except (EOFError, OSError):
            return
        if os.fork() == 0:
            conn.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 1
            try:
                graph_worker.serve(Connection(child))
                code = 0
            finally:
                os._exit(code)  # no interpreter shutdown: DALI's threads end with the process
        os.close(child)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
