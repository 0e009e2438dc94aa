"""The verified-once marker: a shard whose SHA-256 matched once is not hashed again while it is unchanged.

Hashing every shard by the first shuffled batch reads the whole dataset on every rank and on every resume (about
140 GB per rank at ImageNet size). Once a shard's checksum has matched the manifest's, a small marker file says
so, keyed by what changes when the file does: its resolved path, size, modification time (ns), inode and the
manifest's checksum. A later Loader, in this process or another on the same machine, finds the marker and skips
the hash. A file rewritten in place with the same size and modification time is not noticed: run
``stallfree verify`` for a full check.

Markers live in ``$STALLFREE_CACHE_DIR/verified/`` (default ``$XDG_CACHE_HOME/stallfree`` or
``~/.cache/stallfree``), one JSON file per shard version, written with the one atomic write.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

from stallfree.core.atomic import atomic_write
from stallfree.core.home import cache_dir

__all__ = ["is_verified", "mark_verified"]


def _identity(path: Path, sha256: str) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "inode": stat.st_ino, "sha256": sha256}


def _marker(identity: dict[str, Any]) -> Path:
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return cache_dir() / "verified" / f"{key}.json"


def is_verified(path: Path, sha256: str) -> bool:
    """Whether ``path``, as it is now, matched ``sha256`` before."""
    identity = _identity(path, sha256)
    marker = _marker(identity)
    try:
        return bool(json.loads(marker.read_text()) == identity)
    except (OSError, ValueError):  # no marker, or an unreadable one: the shard is hashed, which is always safe
        return False


def mark_verified(path: Path, sha256: str) -> None:
    """Remember that ``path``, as it is now, matched ``sha256``; warns (once per call) if the cache is not writable."""
    identity = _identity(path, sha256)
    try:
        atomic_write(_marker(identity), (json.dumps(identity, sort_keys=True) + "\n").encode())
    except OSError as err:
        warnings.warn(f"could not record that {path} was verified in {cache_dir()} ({err}); it will be hashed "
                      "again next time: set STALLFREE_CACHE_DIR to a writable folder", RuntimeWarning, stacklevel=2)
