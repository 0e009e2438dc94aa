"""The resampler's and ColorJitter's CPU entry points: ``cfunc``s of DALI's C interface, cached on disk.

Every CPU ``RandomResizedCrop``/``Resize`` runs the resampler (:mod:`.resample`) and every CPU ``ColorJitter`` its
kernel (:mod:`.color`) through these, so that a new process loads them from Numba's cache instead of compiling
DALI's own wrappers (:mod:`stallfree.transforms.numba.abi` says why and how). One entry point per configuration of
the resampler; each table compiles an entry point when a graph first looks it up. The whole image and a crop of it
go through separate run functions (two Numba array types, each compiling the resampler once). :func:`compile_all`
compiles every one, as ``stallfree kernels`` would ahead of a first run.

The entry points compile the resampler's sums, its filters, ColorJitter's steps and the ABI's views into themselves,
so this module's cache is checked against those files when it is imported
(:func:`~stallfree.transforms.numba.disk_cache.check_cache`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import carray, njit
from nvidia.dali.plugin.numba import address_as_void_pointer as _ptr  # type: ignore[attr-defined]

from stallfree.transforms.kernels import color, filters
from stallfree.transforms.kernels import resample as resampler
from stallfree.transforms.kernels.color import jitter
from stallfree.transforms.kernels.resample import (
    resample,
    resample_float,
    resample_normalize_chw,
    resample_normalize_hwc,
)
from stallfree.transforms.numba import abi
from stallfree.transforms.numba.abi import (
    LazyEntries,
    hwc_f32,
    hwc_u8,
    same_shape_setup,
    sample_shape,
    vector_f32,
    vector_i32,
)
from stallfree.transforms.numba.disk_cache import check_cache

__all__ = ["JITTER_ENTRIES", "RESIZE_ENTRIES", "RESIZE_FLOAT_ENTRIES", "RESIZE_NORMALIZE_ENTRIES", "compile_all"]


def _check_cache() -> None:
    check_cache(_check_cache, (resampler, filters, color, abi))


_check_cache()  # before the functions below load (or compile) their code


@njit(cache=True)
def _window(ptrs: int, shapes: int, ndims: int, count: int) -> Any:
    """Input 2, the float32 ``(top, left, height, width)`` crop window."""
    shape = sample_shape(shapes, ndims, count, 1, 2, 0)
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
    # The output is (h, w, 3) with (h, w) the size carrier's (input 0): as resample_node._setup.
    for s in range(num_samples):
        out = sample_shape(out_shapes, out_ndims, num_outs, num_samples, 0, s)
        size = sample_shape(in_shapes, in_ndims, num_ins, num_samples, 0, s)
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
    order = carray(_ptr(data[1]), sample_shape(shapes, ndims, count, 1, 1, 0)[0], dtype=np.int32)
    return order, carray(_ptr(data[2]), sample_shape(shapes, ndims, count, 1, 2, 0)[0], dtype=np.float64)



def _resize_normalize_whole(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    # Inputs: the size carrier, the image, the int32 mirror flag, the float32 flags (kernels/resample.py).
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
    # (3, h, w) with (h, w) the size carrier's: as resample_node._setup_chw.
    for s in range(num_samples):
        out = sample_shape(out_shapes, out_ndims, num_outs, num_samples, 0, s)
        size = sample_shape(in_shapes, in_ndims, num_ins, num_samples, 0, s)
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
