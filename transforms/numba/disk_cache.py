"""Numba's disk cache as stallfree uses it: where it is, and dropping code compiled from sources that changed since.

Numba checks a cached function against the stamp of its own file only. A cached function that calls Numba functions
of another file compiles them into itself, so after a change to that file (an upgrade, a ``git pull`` in an editable
install) a new process would load the old machine code. :func:`check_cache` closes that gap for a module: a marker
beside its cache holds a hash of the files it compiles in, and where the hash differs the module's cache files go
and the next use compiles again. The resampler's sums (:mod:`stallfree.transforms.kernels.resample`, which compile
in the filters of :mod:`~stallfree.transforms.kernels.filters`) and the CPU entry points
(:mod:`stallfree.transforms.kernels.entries`) check theirs when imported.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from stallfree.core.atomic import atomic_write

__all__ = ["check_cache", "drop_stale_cache", "numba_cache_folder", "sources_hash", "write_once"]


def numba_cache_folder(function: Callable[..., Any]) -> Path | None:
    """The folder Numba caches ``function``'s compiled code in, or ``None`` where it has none it can write.

    Numba's own locators decide, in Numba's order (``$NUMBA_CACHE_DIR``, the ``__pycache__`` beside the file, the
    user-wide cache), each checking that it can write there.
    """
    from numba.core import caching

    try:
        source = function.__code__.co_filename
    except AttributeError:
        return None
    locators: list[Any] = list(caching.CacheImpl._locator_classes)  # Numba's own order
    for locator_class in locators:
        locator = locator_class.from_function(function, source)
        if locator is not None:
            return Path(locator.get_cache_path())
    return None


def drop_stale_cache(folder: Path, module: str, sources: str) -> bool:
    """Delete ``module``'s cached functions in ``folder`` unless they were compiled from ``sources``.

    ``module`` is the file's name without ``.py`` (Numba names its cache files ``module.function-line...``);
    ``sources`` a hash of the files its functions compile in (:func:`sources_hash`). Returns whether it deleted
    anything.
    """
    marker = folder / f"{module}.sources"
    if marker.exists() and marker.read_text() == sources:
        return False
    stale = [*folder.glob(f"{marker.stem}.*.nbi"), *folder.glob(f"{marker.stem}.*.nbc")]
    for path in stale:
        path.unlink(missing_ok=True)  # another process may have deleted it first
    write_once(marker, sources)
    return bool(stale)


def write_once(path: Path, text: str) -> None:
    """``path`` holding ``text``, written by the one atomic write if absent (several processes may race to it)."""
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text.encode())


def sources_hash(modules: Sequence[ModuleType]) -> str:
    """A hash of the files of ``modules``, in order."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.hexdigest()


def check_cache(anchor: Callable[..., Any], compiled_in: Sequence[ModuleType]) -> None:
    """Drop the cached functions of ``anchor``'s module if the files of ``compiled_in`` changed since they compiled.

    Call it when the module is imported, before its cached functions load: ``anchor`` is any function defined in it
    (its file tells Numba's cache folder), ``compiled_in`` the modules whose Numba functions its own call (its own
    file's stamp Numba checks itself).
    """
    folder = numba_cache_folder(anchor)
    if folder is not None:
        drop_stale_cache(folder, Path(anchor.__code__.co_filename).stem, sources_hash(compiled_in))
