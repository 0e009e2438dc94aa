"""The page cache under a profile's "cold" read: drop a dataset's cached pages, and check that they left.

``posix_fadvise(DONTNEED)`` drops only *clean* pages: right after a dataset is written its pages are dirty, stay
cached, and a "cold" read of them runs at memory speed (12 GiB/s where the disk gives 1.7). So each file is
flushed first (``fdatasync``, or ``fsync`` where there is none), then dropped, and ``mincore`` on a mapping of the
file then says how many of its pages are still resident. Where some are (tmpfs holds its files in the cache;
another process may map them), the drop reports that it could not drop the page cache, and the profile says so
beside its cold figures.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STILL_CACHED", "CacheDrop", "drop_page_cache", "resident_fraction", "resident_pages"]

# Above this share of the pages still resident after the drop, the cold read is not cold.
STILL_CACHED = 0.05


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    if not hasattr(libc, "mincore"):
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


_LIBC = _libc()
_MAP_FAILED = ctypes.c_void_p(-1).value
_FLUSH = getattr(os, "fdatasync", os.fsync)  # the data is what must reach the disk, not the metadata


def resident_pages(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(resident, total)`` pages of ``path`` in the page cache, by ``mincore`` on a read-only mapping.

    Mapping a file reads none of it; ``mincore`` only reports. An empty file has ``(0, 0)``.

    Raises:
        OSError: the file cannot be opened or mapped, or this platform has no ``mincore``.
    """
    if _LIBC is None:
        raise OSError(f"mincore is not available on this platform ({os.name}): cannot check {path}")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0, 0
        # ctypes' own mmap, not Python's: Python's read-only mmap does not expose its address.
        addr = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if addr is None or addr == _MAP_FAILED:
        raise OSError(ctypes.get_errno(), f"mmap failed for {path}")
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = ctypes.create_string_buffer(pages)
    try:
        if _LIBC.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), f"mincore failed for {path}")
    finally:
        _LIBC.munmap(addr, size)
    return sum(b & 1 for b in vec.raw), pages


def resident_fraction(paths: Sequence[Path]) -> float:
    """The share of these files' pages in the page cache (0 when they hold no page)."""
    resident = total = 0
    for path in paths:
        r, t = resident_pages(path)
        resident, total = resident + r, total + t
    return resident / total if total else 0.0


@dataclass(frozen=True)
class CacheDrop:
    """What :func:`drop_page_cache` did: ``note`` is ``None`` when the pages left the cache, else why not."""

    files: int
    resident_fraction: float | None  # after the drop, by mincore; None where it could not be checked
    note: str | None

    @property
    def dropped(self) -> bool:
        """Whether the pages were checked and left the cache (a cold read of them is cold)."""
        return self.note is None


def _flush_and_drop(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as err:
        return f"cannot open {path} ({err.strerror})"
    try:
        try:
            _FLUSH(fd)  # dirty pages are not dropped: write them back first
        except OSError as err:
            return f"flushing {path} to disk failed ({err.strerror})"
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as err:
        return f"posix_fadvise failed for {path} ({err.strerror})"
    finally:
        os.close(fd)
    return None


def drop_page_cache(paths: Sequence[Path]) -> CacheDrop:
    """Flush each file (``fdatasync``), drop its cached pages (``posix_fadvise(DONTNEED)``), check with ``mincore``.

    Needs no privileges. Returns a :class:`CacheDrop` whose ``note`` starts "could not drop the page cache" when
    over 5% of the pages are still resident (tmpfs, or mapped by another process), or says why it could not try
    or check.
    """
    paths = list(paths)
    if not hasattr(os, "posix_fadvise"):
        return CacheDrop(len(paths), None, f"could not drop the page cache: os.posix_fadvise is not available on "
                                           f"{os.name}; the cold read is not cold")
    failures = [why for why in map(_flush_and_drop, paths) if why is not None]
    try:
        left = resident_fraction(paths)
    except OSError as err:
        return CacheDrop(len(paths), None, f"could not check that the page cache was dropped ({err}); the cold "
                                           "read may be warm")
    if left > STILL_CACHED:
        why = f"; {len(failures)} file(s) failed, first: {failures[0]}" if failures else ""
        return CacheDrop(len(paths), left, f"could not drop the page cache: {left:.0%} of the dataset's pages are "
                                           "still cached after fdatasync + posix_fadvise(DONTNEED) (tmpfs, or mapped "
                                           f"by another process?){why}; the cold read is partly warm")
    return CacheDrop(len(paths), left, None)
