"""The CPU Numba operators' DALI entry points as ``cfunc``s cached on disk, so a new process does not recompile them.

They are the resampler's (every CPU ``RandomResizedCrop``/``Resize``) and ColorJitter's. A ``@kernel``'s entry point
is generated when its graph is first built (its signature is known only then) by :mod:`.kernel_cache`, from the
views and types below.

DALI's ``NumbaFunction`` wraps the run and set-up functions it is given in ``cfunc``s of its own, built from
``eval``'d lambdas, which Numba cannot cache: every process compiled them again when its first graph was built
(5 s of a new process's first batch, 40-90 s on a loaded 2-core machine). Here the same C entry points are written
out in this file, with ``cache=True``, one per configuration of the resampler; :func:`stallfree.transforms.
numba.dali.numba_operator` hands their addresses to ``NumbaFunction`` instead of letting it compile.

**Only what a graph uses is compiled.** The tables (:data:`RESIZE_ENTRIES`, ...) compile an entry point when it is
first looked up, not when this module is imported: a new installation's first batch compiled all of them (23-24 s
on a quiet 2-core machine, 42 s on a loaded one) where the usual training graph needs one. The whole image and a
crop of it go through separate run functions (two Numba array types, each compiling the resampler once).
:func:`compile_all` compiles every one, as ``stallfree kernels`` would ahead of a first run.

The ABI is DALI's for ``batch_processing=False`` (``nvidia/dali/plugin/numba/__init__.py``)::

    run(out_ptrs, out_shapes, out_ndims, num_outs, in_ptrs, in_shapes, in_ndims, num_ins)      one sample
    setup(out_shapes, out_ndims, num_outs, in_shapes, in_ndims, num_ins, num_samples)          the whole batch

where ``*_ptrs`` is an int64 array of data pointers, ``*_ndims`` an int32 array of each output's (input's) rank and
``*_shapes`` a ``(count, samples)`` int64 array of pointers to each sample's shape.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FunctionType
from typing import Any, TypeVar

import numpy as np
from numba import carray, cfunc, njit
from numba import types as nbt
from nvidia.dali.plugin.numba import address_as_void_pointer as _ptr  # type: ignore[attr-defined]

from stallfree.core.atomic import atomic_write
from stallfree.transforms import color_kernels, resample_kernels
from stallfree.transforms.color_kernels import jitter
from stallfree.transforms.resample_kernels import (
    resample,
    resample_float,
    resample_normalize_chw,
    resample_normalize_hwc,
)

__all__ = ["JITTER_ENTRIES", "RESIZE_ENTRIES", "RESIZE_FLOAT_ENTRIES", "RESIZE_NORMALIZE_ENTRIES", "RUN", "SETUP",
           "VIEWS", "LazyEntries", "compile_all", "drop_stale_cache", "hwc_f32", "hwc_u8", "numba_cache_folder",
           "same_shape_setup", "vector_f32", "vector_f64", "vector_i32", "vector_u8", "write_once"]


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


def drop_stale_cache(folder: Path, sources: str) -> bool:
    """Delete this module's cached entry points in ``folder`` unless they were compiled from ``sources``.

    Numba checks a cached function against the stamp of its own file only, but the entry points here compile
    :mod:`.resample_kernels` and :mod:`.color_kernels` into themselves: after a change to either (an upgrade, a
    ``git pull`` in an editable install) a new process would load the old machine code. A marker beside the cache
    holds a hash of the sources they were compiled from; where it differs, the module's cache files go and the next
    import compiles again. Returns whether it deleted anything.
    """
    marker = folder / f"{__name__.rsplit('.', 1)[-1]}.sources"
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


def _compiled_sources() -> str:
    """A hash of the files the entry points below compile in (this file's own stamp Numba checks itself)."""
    digest = hashlib.sha256()
    for module in (resample_kernels, color_kernels):
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.hexdigest()


def _check_cache() -> None:
    folder = numba_cache_folder(_check_cache)
    if folder is not None:
        drop_stale_cache(folder, _compiled_sources())


_check_cache()  # before the cfuncs below load (or compile) their code

#: DALI's per-sample run and per-batch set-up signatures.
RUN = nbt.void(nbt.uint64, nbt.uint64, nbt.uint64, nbt.int32, nbt.uint64, nbt.uint64, nbt.uint64, nbt.int32)
SETUP = nbt.void(nbt.uint64, nbt.uint64, nbt.int32, nbt.uint64, nbt.uint64, nbt.int32, nbt.int32)

_COMPILE_LOCK = threading.Lock()


@functools.cache
def _entry_point(function: Callable[..., None]) -> Any:
    """``function``'s ``cfunc`` of DALI's interface (RUN, or SETUP for a set-up), compiled or loaded from the cache."""
    signature = SETUP if function.__code__.co_argcount == 7 else RUN
    return cfunc(signature, cache=True)(function)


K = TypeVar("K")

#: Called as ``notice("slow", 0.0)`` when a lookup has taken :data:`SLOW_S` (it is compiling, not loading from Numba's
#: cache) and ``notice("done", seconds)`` when that compile ends; ``None``: nothing is said. A command sets it
#: (``stallfree.commands.kernels``); the library itself prints nothing.
compile_notice: Callable[[str, float], None] | None = None
#: Longer than this, a lookup is compiling: loading a pair from the cache takes well under a second.
SLOW_S = 1.5


class LazyEntries(Mapping[K, tuple[Any, Any]]):
    """``key -> (run cfunc, setup cfunc)``, each pair compiled (or loaded from Numba's cache) when first looked up.

    A graph needs one or two of the entry points in this module; compiling all of them when it is imported was
    the whole of a new installation's first batch (24-43 s on 2 cores). Now a spec pays only for its own.
    """

    def __init__(self, functions: dict[K, tuple[Any, Any]]):
        self._functions = functions  # Python functions, or cfuncs compiled already (same_shape_setup)

    def __getitem__(self, key: K) -> tuple[Any, Any]:
        run, setup = self._functions[key]
        notice, said = compile_notice, threading.Event()

        def slow() -> None:
            said.set()
            if notice is not None:
                notice("slow", 0.0)

        timer = threading.Timer(SLOW_S, slow) if notice is not None else None
        start = time.perf_counter()
        with _COMPILE_LOCK:  # two graphs built at once compile each entry point once
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                pair = tuple(_entry_point(f) if isinstance(f, FunctionType) else f for f in (run, setup))
            finally:
                if timer is not None:
                    timer.cancel()
                    timer.join()
        if notice is not None and said.is_set():
            notice("done", time.perf_counter() - start)
        return pair

    def __iter__(self) -> Iterator[K]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)


@njit(cache=True)
def _shape(shapes_ptr: int, ndims_ptr: int, count: int, samples: int, which: int, sample: int) -> Any:
    """The shape array of output (or input) ``which`` of ``sample``."""
    ndims = carray(_ptr(ndims_ptr), count, dtype=np.int32)
    table = carray(_ptr(shapes_ptr), (count, samples), dtype=np.int64)
    return carray(_ptr(table[which][sample]), ndims[which], dtype=np.int64)


@njit(cache=True)
def hwc_u8(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of uint8 HWC output (input) ``which``."""
    shape = _shape(shapes, ndims, count, 1, which, 0)
    data = carray(_ptr(ptrs), count, dtype=np.int64)
    return carray(_ptr(data[which]), (shape[0], shape[1], shape[2]), dtype=np.uint8)


@njit(cache=True)
def _data(ptrs: int, count: int, which: int) -> Any:
    return _ptr(carray(_ptr(ptrs), count, dtype=np.int64)[which])


@njit(cache=True)
def vector_u8(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of 1-D uint8 input ``which`` (a kernel's parameter)."""
    return carray(_data(ptrs, count, which), _shape(shapes, ndims, count, 1, which, 0)[0], dtype=np.uint8)


@njit(cache=True)
def vector_i32(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of 1-D int32 input ``which``."""
    return carray(_data(ptrs, count, which), _shape(shapes, ndims, count, 1, which, 0)[0], dtype=np.int32)


@njit(cache=True)
def vector_f32(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of 1-D float32 input ``which``."""
    return carray(_data(ptrs, count, which), _shape(shapes, ndims, count, 1, which, 0)[0], dtype=np.float32)


@njit(cache=True)
def vector_f64(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of 1-D float64 input ``which``."""
    return carray(_data(ptrs, count, which), _shape(shapes, ndims, count, 1, which, 0)[0], dtype=np.float64)


@njit(cache=True)
def _window(ptrs: int, shapes: int, ndims: int, count: int) -> Any:
    """Input 2, the float32 ``(top, left, height, width)`` crop window."""
    shape = _shape(shapes, ndims, count, 1, 2, 0)
    data = carray(_ptr(ptrs), count, dtype=np.int64)
    return carray(_ptr(data[2]), shape[0], dtype=np.float32)


# The whole image and a crop of it are arrays of two Numba types (C-contiguous, and any strides), each compiling
# the resampler once: a run function takes one of them only, so that a graph compiles the one it uses.


@njit(cache=True)
def _resize_whole(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int, antialias: bool) -> None:
    # Input 0 only carries the output size; input 1 is the image.
    resample(hwc_u8(o, os_, on, no, 0), hwc_u8(i, is_, in_, ni, 1), antialias)


@njit(cache=True)
def _resize_crop(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int, antialias: bool) -> None:
    # As _resize_whole, within input 2's window.
    image, w = hwc_u8(i, is_, in_, ni, 1), _window(i, is_, in_, ni)
    top, left = int(w[0]), int(w[1])
    resample(hwc_u8(o, os_, on, no, 0), image[top : top + int(w[2]), left : left + int(w[3])], antialias)


def _resize_plain(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    _resize_whole(o, os_, on, no, i, is_, in_, ni, False)


def _resize_plain_aa(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    _resize_whole(o, os_, on, no, i, is_, in_, ni, True)


def _resize_window(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    _resize_crop(o, os_, on, no, i, is_, in_, ni, False)


def _resize_window_aa(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    _resize_crop(o, os_, on, no, i, is_, in_, ni, True)


def _resize_setup(out_shapes: int, out_ndims: int, num_outs: int, in_shapes: int, in_ndims: int, num_ins: int,
                  num_samples: int) -> None:
    # The output is (h, w, 3) with (h, w) the size carrier's (input 0): as resample._setup.
    for s in range(num_samples):
        out = _shape(out_shapes, out_ndims, num_outs, num_samples, 0, s)
        size = _shape(in_shapes, in_ndims, num_ins, num_samples, 0, s)
        out[0], out[1], out[2] = size[0], size[1], 3


#: ``(windowed, antialias) -> (run cfunc, setup cfunc)`` for the CPU resampler, each compiled on first use.
RESIZE_ENTRIES: Mapping[tuple[bool, bool], tuple[Any, Any]] = LazyEntries({
    (False, False): (_resize_plain, _resize_setup),
    (False, True): (_resize_plain_aa, _resize_setup),
    (True, False): (_resize_window, _resize_setup),
    (True, True): (_resize_window_aa, _resize_setup),
})


@njit(cache=True)
def _jitter_params(ptrs: int, shapes: int, ndims: int, count: int) -> Any:
    """Inputs 1 and 2 of ColorJitter's operator: the int32 step order and the float64 factors."""
    data = carray(_ptr(ptrs), count, dtype=np.int64)
    order = carray(_ptr(data[1]), _shape(shapes, ndims, count, 1, 1, 0)[0], dtype=np.int32)
    return order, carray(_ptr(data[2]), _shape(shapes, ndims, count, 1, 2, 0)[0], dtype=np.float64)


@njit(cache=True)
def hwc_f32(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of float32 HWC output (input) ``which``."""
    shape = _shape(shapes, ndims, count, 1, which, 0)
    data = carray(_ptr(ptrs), count, dtype=np.int64)
    return carray(_ptr(data[which]), (shape[0], shape[1], shape[2]), dtype=np.float32)


def _resize_normalize_whole(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    # Inputs: the size carrier, the image, the int32 mirror flag, the float32 flags (resample_kernels.py).
    mirror = vector_i32(i, is_, in_, ni, ni - 2)[0] != 0
    image, flags = hwc_u8(i, is_, in_, ni, 1), vector_f32(i, is_, in_, ni, ni - 1)
    resample_normalize_hwc(hwc_f32(o, os_, on, no, 0), image, flags, mirror)


def _resize_normalize_whole_chw(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    # As _resize_normalize_whole, laid out (3, h, w).
    mirror = vector_i32(i, is_, in_, ni, ni - 2)[0] != 0
    image, flags = hwc_u8(i, is_, in_, ni, 1), vector_f32(i, is_, in_, ni, ni - 1)
    resample_normalize_chw(hwc_f32(o, os_, on, no, 0), image, flags, mirror)


@njit(cache=True)
def _crop(i: int, is_: int, in_: int, ni: int) -> Any:
    """Input 1 (the image) within input 2's window."""
    image, w = hwc_u8(i, is_, in_, ni, 1), _window(i, is_, in_, ni)
    top, left = int(w[0]), int(w[1])
    return image[top : top + int(w[2]), left : left + int(w[3])]


def _resize_normalize_crop(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    # As _resize_normalize_whole, with input 2 the crop window.
    mirror = vector_i32(i, is_, in_, ni, ni - 2)[0] != 0
    crop, flags = _crop(i, is_, in_, ni), vector_f32(i, is_, in_, ni, ni - 1)
    resample_normalize_hwc(hwc_f32(o, os_, on, no, 0), crop, flags, mirror)


def _resize_normalize_crop_chw(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    # As _resize_normalize_crop, laid out (3, h, w).
    mirror = vector_i32(i, is_, in_, ni, ni - 2)[0] != 0
    crop, flags = _crop(i, is_, in_, ni), vector_f32(i, is_, in_, ni, ni - 1)
    resample_normalize_chw(hwc_f32(o, os_, on, no, 0), crop, flags, mirror)


_RESIZE_NORMALIZE_RUNS = {(False, False): _resize_normalize_whole, (False, True): _resize_normalize_whole_chw,
                          (True, False): _resize_normalize_crop, (True, True): _resize_normalize_crop_chw}


def _resize_normalize_setup_chw(out_shapes: int, out_ndims: int, num_outs: int, in_shapes: int, in_ndims: int,
                                num_ins: int, num_samples: int) -> None:
    # (3, h, w) with (h, w) the size carrier's: as resample._setup_chw.
    for s in range(num_samples):
        out = _shape(out_shapes, out_ndims, num_outs, num_samples, 0, s)
        size = _shape(in_shapes, in_ndims, num_ins, num_samples, 0, s)
        out[0], out[1], out[2] = 3, size[0], size[1]


#: ``(windowed, chw) -> (run cfunc, setup cfunc)`` for the resampler writing normalized float32, compiled on first use.
RESIZE_NORMALIZE_ENTRIES: Mapping[tuple[bool, bool], tuple[Any, Any]] = LazyEntries({
    (windowed, chw): (_RESIZE_NORMALIZE_RUNS[(windowed, chw)], _resize_normalize_setup_chw if chw else _resize_setup)
    for windowed in (False, True)
    for chw in (False, True)
})


def _resize_float_whole(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    # Inputs: the size carrier, the float32 image, the float32 flags [antialias, kind].
    flags = vector_f32(i, is_, in_, ni, ni - 1)
    resample_float(hwc_f32(o, os_, on, no, 0), hwc_f32(i, is_, in_, ni, 1), flags[0] != 0, int(flags[1]))


def _resize_float_crop(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    # As _resize_float_whole, with input 2 the crop window.
    image, w, flags = hwc_f32(i, is_, in_, ni, 1), _window(i, is_, in_, ni), vector_f32(i, is_, in_, ni, ni - 1)
    top, left = int(w[0]), int(w[1])
    crop = image[top : top + int(w[2]), left : left + int(w[3])]
    resample_float(hwc_f32(o, os_, on, no, 0), crop, flags[0] != 0, int(flags[1]))


#: ``windowed -> (run cfunc, setup cfunc)`` for the float32 resampler (a resize after Normalize), compiled on first use.
RESIZE_FLOAT_ENTRIES: Mapping[bool, tuple[Any, Any]] = LazyEntries({
    False: (_resize_float_whole, _resize_setup), True: (_resize_float_crop, _resize_setup)})


def _jitter_u8(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    out, image = hwc_u8(o, os_, on, no, 0), hwc_u8(i, is_, in_, ni, 0)
    order, factors = _jitter_params(i, is_, in_, ni)
    jitter(out, image, order, factors, np.float32(255.0), True)


def _jitter_f32(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    out, image = hwc_f32(o, os_, on, no, 0), hwc_f32(i, is_, in_, ni, 0)
    order, factors = _jitter_params(i, is_, in_, ni)
    jitter(out, image, order, factors, np.float32(1.0), False)


@cfunc(SETUP, cache=True)
def same_shape_setup(out_shapes: int, out_ndims: int, num_outs: int, in_shapes: int, in_ndims: int, num_ins: int,
                      num_samples: int) -> None:
    """Set-up of an operator whose output has the shape of its image (input 0), as dali's."""
    for s in range(num_samples):
        out = _shape(out_shapes, out_ndims, num_outs, num_samples, 0, s)
        image = _shape(in_shapes, in_ndims, num_ins, num_samples, 0, s)
        out[0], out[1], out[2] = image[0], image[1], image[2]


#: ``integral (uint8 image) -> (run cfunc, setup cfunc)`` for ColorJitter on the CPU, compiled on first use.
JITTER_ENTRIES: Mapping[bool, tuple[Any, Any]] = LazyEntries({True: (_jitter_u8, same_shape_setup),
                                                             False: (_jitter_f32, same_shape_setup)})


def compile_all() -> None:
    """Compile (or load from Numba's cache) every entry point above now, as a first graph would one by one."""
    tables: tuple[Mapping[Any, tuple[Any, Any]], ...] = (RESIZE_ENTRIES, RESIZE_NORMALIZE_ENTRIES,
                                                       RESIZE_FLOAT_ENTRIES, JITTER_ENTRIES)
    for table in tables:
        for key in table:
            table[key]


#: The name of the view of each dtype here: ``(HWC image view, 1-D parameter view)``, ``None`` where there is none.
VIEWS: dict[type, tuple[str | None, str]] = {
    np.uint8: ("hwc_u8", "vector_u8"),
    np.float32: ("hwc_f32", "vector_f32"),
    np.float64: (None, "vector_f64"),
    np.int32: (None, "vector_i32"),
}
