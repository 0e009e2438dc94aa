"""Pick rows and columns by index: the one CPU operator behind padding modes and nearest-neighbour resizing.

``out[y, x] = image[rows[y], cols[x]]``, and the per-channel ``fill`` where ``rows[y]`` or ``cols[x]`` is ``-1``.
Many of torchvision's geometric steps are this on a per-sample pair of index tables that the host draws exactly:

    step                                    rows (cols alike)
    Pad / RandomCrop, edge|reflect|symmetric  numpy's np.pad index of each padded row, windowed by the crop
    Resize / RandomResizedCrop, NEAREST     PIL's nearest source row, floor(top + (y + 0.5) * h / out_h)

so one operator, with no arithmetic on pixels, equals torchvision's output to the bit. The output's size is the
tables' lengths: a step that changes the size, which a per-pixel ``@kernel`` (same shape in, same shape out)
cannot express.

Its DALI entry points are ``cfunc``s cached on disk, as :mod:`.entries`', so that a new process loads them
instead of compiling; the gather and the entry points live in this one file, whose stamp Numba checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from numba import carray, cfunc
from nvidia.dali.plugin.numba import address_as_void_pointer as _ptr  # type: ignore[attr-defined]

from stallfree.transforms.numba.abi import RUN, SETUP, hwc_f32, hwc_u8, vector_f32, vector_i32

__all__ = ["gather", "gather_node"]


@numba.njit(cache=True)
def gather(out: np.ndarray, image: np.ndarray, rows: np.ndarray, cols: np.ndarray, fill: np.ndarray) -> None:
    """``out[y, x] = image[rows[y], cols[x]]``, or ``fill`` where an index is negative (HWC, any channel count)."""
    channels = out.shape[2]
    for y in range(out.shape[0]):
        r = rows[y]
        for x in range(out.shape[1]):
            c = cols[x]
            if r < 0 or c < 0:
                for k in range(channels):
                    out[y, x, k] = fill[k]
            else:
                for k in range(channels):
                    out[y, x, k] = image[r, c, k]


@cfunc(RUN, cache=True)
def _gather_u8(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    out, image = hwc_u8(o, os_, on, no, 0), hwc_u8(i, is_, in_, ni, 0)
    fill = vector_f32(i, is_, in_, ni, 3)
    gather(out, image, vector_i32(i, is_, in_, ni, 1), vector_i32(i, is_, in_, ni, 2), fill.astype(np.uint8))


@cfunc(RUN, cache=True)
def _gather_f32(o: int, os_: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    out, image = hwc_f32(o, os_, on, no, 0), hwc_f32(i, is_, in_, ni, 0)
    gather(out, image, vector_i32(i, is_, in_, ni, 1), vector_i32(i, is_, in_, ni, 2), vector_f32(i, is_, in_, ni, 3))


@numba.njit(cache=True)
def _shape(shapes_ptr: int, ndims_ptr: int, count: int, samples: int, which: int, sample: int) -> Any:
    ndims = carray(_ptr(ndims_ptr), count, dtype=np.int32)
    table = carray(_ptr(shapes_ptr), (count, samples), dtype=np.int64)
    return carray(_ptr(table[which][sample]), ndims[which], dtype=np.int64)


@cfunc(SETUP, cache=True)
def _gather_setup(out_shapes: int, out_ndims: int, num_outs: int, in_shapes: int, in_ndims: int, num_ins: int,
                  num_samples: int) -> None:
    # (len(rows), len(cols), the image's channels): inputs 1 and 2 are the tables, input 0 the image.
    for s in range(num_samples):
        out = _shape(out_shapes, out_ndims, num_outs, num_samples, 0, s)
        image = _shape(in_shapes, in_ndims, num_ins, num_samples, 0, s)
        rows = _shape(in_shapes, in_ndims, num_ins, num_samples, 1, s)
        cols = _shape(in_shapes, in_ndims, num_ins, num_samples, 2, s)
        out[0], out[1], out[2] = rows[0], cols[0], image[2]


def _setup(outs: Any, ins: Any) -> None:
    for i in range(len(outs[0])):
        outs[0][i][0], outs[0][i][1], outs[0][i][2] = ins[1][i][0], ins[2][i][0], ins[0][i][2]


def _run_u8(out: np.ndarray, image: np.ndarray, rows: np.ndarray, cols: np.ndarray, fill: np.ndarray) -> None:
    gather(out, image, rows, cols, fill.astype(np.uint8))


def _run_f32(out: np.ndarray, image: np.ndarray, rows: np.ndarray, cols: np.ndarray, fill: np.ndarray) -> None:
    gather(out, image, rows, cols, fill)


def gather_node(image: Any, rows: Any, cols: Any, fill: Sequence[float], *, dtype: str) -> Any:
    """A CPU DALI node picking ``rows`` and ``cols`` (per-sample int32 nodes) of the HWC ``image`` node.

    Args:
        image: HWC uint8 or float32 node.
        rows: per-sample 1-D int32 source rows, ``-1`` for ``fill``.
        cols: per-sample 1-D int32 source columns, ``-1`` for ``fill``.
        fill: one value per channel (3), on the image's scale.
        dtype: ``"uint8"`` or ``"float32"``, the image's element type.
    """
    import nvidia.dali.types as types

    from stallfree.transforms.numba.dali import numba_operator

    if dtype not in ("uint8", "float32"):
        raise ValueError(f"gather_node: dtype must be 'uint8' or 'float32', got {dtype!r}")
    integral = dtype == "uint8"
    kind = np.uint8 if integral else np.float32
    constant = types.Constant(np.asarray(fill, np.float32), device="cpu")
    operator = numba_operator(
        _run_u8 if integral else _run_f32,
        _setup,
        in_types=[kind, np.int32, np.int32, np.float32],
        ins_ndim=[3, 1, 1, 1],
        out_type=kind,
        entries=(_gather_u8 if integral else _gather_f32, _gather_setup),
    )
    return operator(image, rows, cols, constant)
