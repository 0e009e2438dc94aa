"""The index of a WebDataset tar: where each sample's image lies, walked once and kept.

Walking a tar reads its member headers (locally through the file; remotely through :class:`_Ranged`, which reads
1 MiB ranges with :func:`~stallfree.ingest.remote.read_range`, the reads' own retries, stall and error rules, and
seeks over large members) and groups them into samples by :func:`stallfree.ingest.tars.samples`, the
grouping ``stallfree ingest`` uses, so the two accept and refuse the same members. The index (every sample's key,
image offset and size, and its ``.cls`` label, and the samples refused) is kept as a small JSON file in the index
cache, ``webdataset-index/`` beside the shard cache (``~/.cache/stallfree/`` by default, or the reader's
``cache_dir``), one file per tar, named by a hash of its path or URL and holding the tar's size and its
modification time (local) or ETag (remote): a tar that changed is walked again.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stallfree.core.atomic import atomic_write
from stallfree.core.home import cache_dir as stallfree_cache_dir
from stallfree.ingest.remote import Retry, read_range
from stallfree.ingest.tars import compressed, label_bytes, members, samples

__all__ = ["FORMAT", "default_index_dir", "load", "save", "walk", "walk_remote"]

FORMAT = 2  # the index file's format; another one is walked again (2: labels under the one label rule, issue 37)
PIECE = 1 << 20  # the remote walk's range size: small members come many to a read, large ones are skipped


def default_index_dir() -> Path:
    """``webdataset-index/`` in the stallfree cache, beside the shard cache's ``shards/``."""
    return stallfree_cache_dir() / "webdataset-index"


def _file(index_dir: Path, shown: str) -> Path:
    return index_dir / (hashlib.sha256(shown.encode()).hexdigest()[:32] + ".json")


def save(index_dir: Path, index: dict[str, Any], shown: str, size: int, stamp: str) -> None:
    """Keep the ``index`` of the tar ``shown`` (``size`` bytes, changed when ``stamp`` changes) in ``index_dir``."""
    atomic_write(_file(index_dir, shown), json.dumps({**index, "format": FORMAT, "tar": shown, "size": size,
                                                      "stamp": stamp}).encode())


def load(index_dir: Path, shown: str, size: int, stamp: str) -> dict[str, Any] | None:
    """The kept index of a tar, or None when there is none, or it is of another size, stamp or format."""
    index_file = _file(index_dir, shown)
    try:
        index = json.loads(index_file.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as err:  # written atomically, so only another program could have left it so
        warnings.warn(f"the index {index_file} of {shown} is not JSON ({err}); walking the tar again", UserWarning,
                      stacklevel=3)
        return None
    fresh = (index.get("format"), index.get("tar"), index.get("size"), index.get("stamp")) == (
        FORMAT, shown, size, stamp)
    return index if fresh and stamp else None  # no stamp (a server without ETag): every open walks the tar


def walk_remote(fs: Any, path: str, shown: str, size: int, retry: Retry) -> dict[str, Any]:
    """:func:`walk` of the tar at ``path`` on the fsspec file system ``fs``, read in ``PIECE`` ranges.

    Raises:
        ValueError: as :func:`walk`.
        RangeIgnored: the server ignores Range (the caller walks the tar fetched whole).
        RemoteStoreError: as :func:`~stallfree.ingest.remote.read_range` (retries spent, a 403 or 404), naming
            ``shown``.
    """
    return walk(_Ranged(fs, path, shown, size, retry), shown, size)


class _Ranged:
    """A read-only, seekable view of a remote object for :mod:`tarfile`: ``PIECE`` bytes a request, the last kept.

    A tar's headers are read in order, each a 512-byte read followed by a seek over the member's data: small members
    come many to a request, large ones are skipped without being fetched.
    """

    def __init__(self, fs: Any, path: str, shown: str, size: int, retry: Retry):
        self._fs, self._path, self._shown, self._size, self._retry = fs, path, shown, size, retry
        self._position = 0
        self._start, self._data = 0, b""  # the last range fetched

    def read(self, count: int = -1) -> bytes:
        end = self._size if count is None or count < 0 else min(self._size, self._position + count)
        if end <= self._position:
            return b""
        if not self._start <= self._position or end > self._start + len(self._data):
            self._start = self._position
            self._data = read_range(self._fs, self._path, self._shown, self._start,
                                    min(self._size, max(end, self._start + PIECE)), self._retry)
        out = self._data[self._position - self._start : end - self._start]
        self._position += len(out)
        return out

    def seek(self, offset: int, whence: int = 0) -> int:
        self._position = {0: 0, 1: self._position, 2: self._size}[whence] + offset
        return self._position

    def tell(self) -> int:
        return self._position


def walk(f: Any, shown: str, size: int) -> dict[str, Any]:
    """The index of the tar open as ``f`` (seekable, ``size`` bytes): its samples, and the samples it refused.

    Raises:
        ValueError: the tar is compressed, not a tar, or damaged (the first damage is named).
    """
    if compressed(f.read(3)):
        raise ValueError(f"{shown} is compressed; WebDataset tars are read by offset, so they must be uncompressed "
                         "(gunzip them, or ingest them)")
    f.seek(0)
    try:
        tar = tarfile.open(fileobj=f, mode="r:")
    except tarfile.ReadError as err:
        raise ValueError(f"{shown} is not a readable tar ({err})") from err
    name = shown.rsplit("/", 1)[-1]
    damage: list[dict[str, str]] = []
    refused: list[dict[str, str]] = []
    labels: dict[str, bytes] = {}
    read_label = label_bytes(tar)

    def listed() -> Iterator[tarfile.TarInfo]:
        """The members, each ``.cls`` read as it passes: read later, each would be a seek back (a request)."""
        for member in members(tar, name, size, damage):
            if member.isfile() and member.name.lower().endswith(".cls"):
                labels[member.name] = read_label(member)
            yield member

    with tar:
        found = samples(name, listed(), lambda member: labels[member.name], refused)
    if damage:
        raise ValueError(f"{_in(shown, damage[0]['path'])}: {damage[0]['reason']} (the whole tar is refused; "
                         "re-copy it, or ingest the tars to keep the samples before the damage)")
    return {"keys": [s.key for s in found], "offsets": [s.offset for s in found], "sizes": [s.size for s in found],
            "labels": [s.label for s in found], "refused": [{**r, "path": _in(shown, r["path"])} for r in refused]}


def _in(shown: str, where: str) -> str:
    """A record's ``tar:member`` with the tar's full path or URL in place of its name."""
    return shown.rsplit("/", 1)[0] + "/" + where if "/" in shown else where
