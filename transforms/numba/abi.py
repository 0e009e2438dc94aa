"""DALI's C interface for Numba operators whose entry points are ``cfunc``s cached on disk, and their lookup tables.

DALI's ``NumbaFunction`` wraps the run and set-up functions it is given in ``cfunc``s of its own, built from
``eval``'d lambdas, which Numba cannot cache: every process compiled them again when its first graph was built
(5 s of a new process's first batch, 40-90 s on a loaded 2-core machine). stallfree writes the same C entry points
out as module-level functions compiled with ``cache=True`` instead (the resampler's and ColorJitter's in
:mod:`stallfree.transforms.kernels.entries`, the gather's and the warp's beside their kernels, a ``@kernel``'s in a
file :mod:`.kernel_cache` generates from the views and types below), and :func:`stallfree.transforms.numba.dali.
numba_operator` hands their addresses to ``NumbaFunction`` instead of letting it compile.

**Only what a graph uses is compiled.** A table of entry points (:class:`LazyEntries`) compiles an entry point when it
is first looked up, not when its module is imported: a new installation's first batch compiled all of them (23-24 s
on a quiet 2-core machine, 42 s on a loaded one) where the usual training graph needs one.

The ABI is DALI's for ``batch_processing=False`` (``nvidia/dali/plugin/numba/__init__.py``)::

    run(out_ptrs, out_shapes, out_ndims, num_outs, in_ptrs, in_shapes, in_ndims, num_ins)      one sample
    setup(out_shapes, out_ndims, num_outs, in_shapes, in_ndims, num_ins, num_samples)          the whole batch

where ``*_ptrs`` is an int64 array of data pointers, ``*_ndims`` an int32 array of each output's (input's) rank and
``*_shapes`` a ``(count, samples)`` int64 array of pointers to each sample's shape.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FunctionType
from typing import Any, TypeVar

import numpy as np
from numba import carray, cfunc, njit
from numba import types as nbt
from nvidia.dali.plugin.numba import address_as_void_pointer as _ptr  # type: ignore[attr-defined]

__all__ = ["RUN", "SETUP", "VIEWS", "LazyEntries", "hwc_f32", "hwc_u8", "same_shape_setup", "sample_shape",
           "vector_f32", "vector_f64", "vector_i32", "vector_u8"]


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
def sample_shape(shapes_ptr: int, ndims_ptr: int, count: int, samples: int, which: int, sample: int) -> Any:
    """The shape array of output (or input) ``which`` of ``sample``."""
    ndims = carray(_ptr(ndims_ptr), count, dtype=np.int32)
    table = carray(_ptr(shapes_ptr), (count, samples), dtype=np.int64)
    return carray(_ptr(table[which][sample]), ndims[which], dtype=np.int64)


@njit(cache=True)
def hwc_u8(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of uint8 HWC output (input) ``which``."""
    shape = sample_shape(shapes, ndims, count, 1, which, 0)
    data = carray(_ptr(ptrs), count, dtype=np.int64)
    return carray(_ptr(data[which]), (shape[0], shape[1], shape[2]), dtype=np.uint8)


@njit(cache=True)
def _data(ptrs: int, count: int, which: int) -> Any:
    return _ptr(carray(_ptr(ptrs), count, dtype=np.int64)[which])


@njit(cache=True)
def vector_u8(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of 1-D uint8 input ``which`` (a kernel's parameter)."""
    return carray(_data(ptrs, count, which), sample_shape(shapes, ndims, count, 1, which, 0)[0], dtype=np.uint8)


@njit(cache=True)
def vector_i32(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of 1-D int32 input ``which``."""
    return carray(_data(ptrs, count, which), sample_shape(shapes, ndims, count, 1, which, 0)[0], dtype=np.int32)


@njit(cache=True)
def vector_f32(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of 1-D float32 input ``which``."""
    return carray(_data(ptrs, count, which), sample_shape(shapes, ndims, count, 1, which, 0)[0], dtype=np.float32)


@njit(cache=True)
def vector_f64(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of 1-D float64 input ``which``."""
    return carray(_data(ptrs, count, which), sample_shape(shapes, ndims, count, 1, which, 0)[0], dtype=np.float64)



@njit(cache=True)
def hwc_f32(ptrs: int, shapes: int, ndims: int, count: int, which: int) -> Any:
    """Sample view of float32 HWC output (input) ``which``."""
    shape = sample_shape(shapes, ndims, count, 1, which, 0)
    data = carray(_ptr(ptrs), count, dtype=np.int64)
    return carray(_ptr(data[which]), (shape[0], shape[1], shape[2]), dtype=np.float32)


@cfunc(SETUP, cache=True)
def same_shape_setup(out_shapes: int, out_ndims: int, num_outs: int, in_shapes: int, in_ndims: int, num_ins: int,
                      num_samples: int) -> None:
    """Set-up of an operator whose output has the shape of its image (input 0), as :mod:`.dali`'s."""
    for s in range(num_samples):
        out = sample_shape(out_shapes, out_ndims, num_outs, num_samples, 0, s)
        image = sample_shape(in_shapes, in_ndims, num_ins, num_samples, 0, s)
        out[0], out[1], out[2] = image[0], image[1], image[2]


#: The name of the view of each dtype here: ``(HWC image view, 1-D parameter view)``, ``None`` where there is none.
VIEWS: dict[type, tuple[str | None, str]] = {
    np.uint8: ("hwc_u8", "vector_u8"),
    np.float32: ("hwc_f32", "vector_f32"),
    np.float64: (None, "vector_f64"),
    np.int32: (None, "vector_i32"),
}
