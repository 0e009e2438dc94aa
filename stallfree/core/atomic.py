"""The one atomic write: a file is either absent or complete, and survives a crash once written.

Every file stallfree writes for later reading (shards, manifests, checkpoints, span dumps, reports) goes through
here: the bytes go to a temporary name in the same folder, are flushed to disk (``fsync``), renamed over the
target (``os.replace``, atomic on POSIX) and the folder's entry is flushed too, so that neither a reader nor a
power cut ever sees half a file. The temporary name carries the host and process, so that writers on several
machines sharing a folder (checkpoints on a shared ``--out``) never write into each other's temporary file.

A writer killed mid-write (``kill -9``, a power cut) leaves its temporary file behind, under a name no reader
looks at; :func:`remove_temporaries` removes those of given targets, for a writer that knows it is their only one
(an ingest holding its folder's lock).
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "atomic_write", "remove_temporaries"]

#: Every temporary name :func:`_tmp` gives (and ``.NAME.tmp``, an older stallfree's), with the target's name.
_TMP_NAME = re.compile(r"\.(?P<target>.+)\.tmp(?:-.+-\d+-\d+)?")


def _tmp(path: Path) -> Path:
    # the thread too: two threads of one process may write the same file (two Loaders sharing a shard cache)
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}")


def remove_temporaries(folder: str | os.PathLike[str], targets: Collection[str]) -> list[str]:
    """Remove the temporary files writers of ``folder``'s files ``targets`` left there; returns their names.

    Any host's and process's: call it only where no other writer of these targets can be alive (the caller holds
    the lock that every writer of them takes). Files of other targets, and anything not named as :func:`_tmp`
    names, are left alone.
    """
    removed = []
    with os.scandir(folder) as entries:
        for entry in entries:
            match = _TMP_NAME.fullmatch(entry.name)
            if match and match["target"] in targets and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(entry.name)
    return sorted(removed)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str], durable: bool = True) -> Iterator[Path]:
    """A temporary path to write ``path``'s content to; on a clean exit it becomes ``path``, durably.

    For writers that want a file name (pyarrow's IPC writer, ``torch.save``). On an exception the temporary
    file is removed and ``path`` is left as it was. ``durable=False`` skips both flushes (still atomic for
    readers, not across a power cut): for a cache whose files are checked against their SHA-256 before they are
    used again, where a flush per file only makes each download wait for the disk.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(target)
    try:
        yield tmp
        if durable:
            _fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(target.parent)


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably (see the module's docstring)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
