"""Resizing uint8 images in the CPU graph: PIL's separable filters as a Numba kernel inside DALI.

Torchvision resizes PIL images with ``Image.resize(..., BILINEAR)``: a separable triangle filter whose support
widens with the downscale factor (antialiasing), applied along one axis, then the other (in Pillow's order, see
:func:`~.resample._resample`), in 22-bit fixed point with a uint8 image between the two passes. The kernels
(:mod:`.resample`) compute the same thing and equal PIL's output exactly
(``tests/transforms/kernels/test_resample.py``), and so for PIL's other filters (BICUBIC, BOX, HAMMING, LANCZOS), the
same passes with their weights (``tests/transforms/kernels/test_interpolation.py``); this module runs them in the graph.
It exists for speed: on the crops of an ImageNet-like training graph it runs 2.9x DALI's CPU ``fn.resize``
(``stallfree bench resize``; the figures are in docs/speed.md), and resizing is the largest cost of a CPU training
graph after decoding. In a GPU graph (``device="gpu"``) the same filters run as ``numba.cuda`` kernels
(:mod:`.resample_cuda`), giving the CPU's pixels to the bit; float images (a resize after ``Normalize``) go through
:func:`resize_float_node`, the filters in float on either device (:func:`~.resample.resample_float`).

Each sample's output size comes in as the shape of an empty array (``spec.size_input``): DALI's set-up function
sizes a Numba operator's output from input shapes alone, and so one compiled operator (a few seconds of Numba
compilation, once per process) serves every size, fixed or per sample.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from nvidia.dali.pipeline import do_not_convert

from stallfree.transforms.kernels.resample import resample, resample_float, resample_normalize
from stallfree.transforms.numba.dali import numba_operator

__all__ = ["resize_float_node", "resize_node", "resize_normalize_node"]

def _setup(outs: Any, ins: Any) -> None:
    # Input 0 is the size carrier (spec.size_input): an empty (height, width, 0) array. DALI's set-up sees input
    # shapes only, and graph images are RGB (decoded as RGB, or raw RGB shards), so the output is (h, w, 3).
    for i in range(len(outs[0])):
        outs[0][i][0], outs[0][i][1], outs[0][i][2] = ins[0][i][0], ins[0][i][1], 3


@functools.cache  # one function per configuration, so that numba_operator reuses its compiled operator
@do_not_convert
def _run(antialias: bool, windowed: bool) -> Callable[..., None]:
    if windowed:

        def run_window(out: np.ndarray, _size: np.ndarray, image: np.ndarray, window: np.ndarray) -> None:
            top, left = int(window[0]), int(window[1])
            resample(out, image[top : top + int(window[2]), left : left + int(window[3])], antialias)

        return run_window

    def run(out: np.ndarray, _size: np.ndarray, image: np.ndarray) -> None:
        resample(out, image, antialias)

    return run


def resize_node(image: Any, size: Any, *, antialias: bool = True, window: Any = None, kind: int = 0,
                device: Literal["cpu", "gpu"] = "cpu") -> Any:
    """A DALI node resizing each RGB uint8 sample as PIL's BILINEAR (torchvision's resize of a PIL image).

    Args:
        image: the HWC RGB uint8 node.
        size: the per-sample output size, a node of :func:`stallfree.transforms.spec.size_input` arrays.
        antialias: widen the filter when downscaling (PIL always does; torchvision's default).
        window: an optional node of per-sample ``(top, left, height, width)`` float32: crop it first, then resize.
        kind: PIL's filter, by its code in :data:`~.filters.FILTERS`. Any but BILINEAR (0) runs as the
            resampler that writes floats (whose entry points are cached), with mean 0 and std 1, cast back to
            uint8: the floats are the uint8 levels, so the cast is exact.
        device: ``"gpu"``: the GPU kernel (:mod:`.resample_cuda`), any filter, on the GPU ``image``.
    """
    if device == "gpu":
        return _gpu_node("uint8", image, size, window, None, [float(antialias), float(kind)], np.uint8, chw=False)
    if kind:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        levels = resize_normalize_node(image, size, mean=[0.0] * 3, std=[1.0] * 3, chw=False, antialias=antialias,
                                       window=window, kind=kind)
        return fn.cast(levels, dtype=types.UINT8)
    from stallfree.transforms.kernels.entries import RESIZE_ENTRIES  # loads the cached entry points (compiles once)

    inputs = [size, image] if window is None else [size, image, window]
    operator = numba_operator(
        _run(antialias, window is not None),
        _setup,
        in_types=[np.uint8, np.uint8, np.float32][: len(inputs)],
        ins_ndim=[3, 3, 1][: len(inputs)],
        out_type=np.uint8,
        entries=RESIZE_ENTRIES[(window is not None, antialias)],
    )
    return operator(*inputs)


def _setup_chw(outs: Any, ins: Any) -> None:
    # As _setup, laid out (3, h, w).
    for i in range(len(outs[0])):
        outs[0][i][0], outs[0][i][1], outs[0][i][2] = 3, ins[0][i][0], ins[0][i][1]


@functools.cache
@do_not_convert
def _run_normalized(windowed: bool) -> Callable[..., None]:
    if windowed:

        def run_window(out: np.ndarray, _size: np.ndarray, image: np.ndarray, window: np.ndarray,
                       mirror: np.ndarray, flags: np.ndarray) -> None:
            top, left = int(window[0]), int(window[1])
            crop = image[top : top + int(window[2]), left : left + int(window[3])]
            resample_normalize(out, crop, flags, mirror[0] != 0)

        return run_window

    def run(out: np.ndarray, _size: np.ndarray, image: np.ndarray, mirror: np.ndarray, flags: np.ndarray) -> None:
        resample_normalize(out, image, flags, mirror[0] != 0)

    return run


def resize_normalize_node(
    image: Any,
    size: Any,
    *,
    mean: list[float],
    std: list[float],
    chw: bool,
    antialias: bool = True,
    window: Any = None,
    mirror: Any = None,
    kind: int = 0,
    device: Literal["cpu", "gpu"] = "cpu",
) -> Any:
    """:func:`resize_node` and ``crop_mirror_normalize(mean, std, mirror, float32)`` as one DALI node.

    Args:
        image: the HWC RGB uint8 node.
        size: the per-sample output size, a node of :func:`stallfree.transforms.spec.size_input` arrays.
        mean: per channel, on the 0..255 scale.
        std: per channel, on the 0..255 scale.
        chw: lay the output out ``CHW`` (else ``HWC``).
        antialias: as :func:`resize_node`.
        window: as :func:`resize_node`.
        mirror: an optional node of per-sample int32 flags (0-d): mirror left to right where non-zero.
        kind: PIL's filter, as :func:`resize_node`'s.
        device: as :func:`resize_node`'s.
    """
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types

    inverse = [1.0 / s for s in std]
    if device == "gpu":
        values = [*mean, *inverse, float(antialias), float(chw), float(kind)]
        flip = None if mirror is None else fn.reshape(mirror, shape=[1])
        return _gpu_node("normalize", image, size, window, flip, values, np.float32, chw=chw)

    from stallfree.transforms.kernels.entries import RESIZE_NORMALIZE_ENTRIES

    flags = types.Constant(np.array([*mean, *inverse, antialias, chw, kind], np.float32), device="cpu")
    if mirror is None:
        mirror = types.Constant(np.zeros(1, np.int32), device="cpu")
    else:
        mirror = fn.reshape(mirror, shape=[1])
    inputs, kinds = [size, image, mirror, flags], [np.uint8, np.uint8, np.int32, np.float32]
    if window is not None:
        inputs, kinds = [size, image, window, mirror, flags], [np.uint8, np.uint8, np.float32, np.int32, np.float32]
    operator = numba_operator(
        _run_normalized(window is not None),
        _setup_chw if chw else _setup,
        in_types=kinds,
        ins_ndim=[3, 3] + [1] * (len(inputs) - 2),
        out_type=np.float32,
        entries=RESIZE_NORMALIZE_ENTRIES[(window is not None, chw)],
        layout="CHW" if chw else "HWC",
    )
    return operator(*inputs)


@functools.cache
@do_not_convert
def _run_float(windowed: bool) -> Callable[..., None]:
    if windowed:

        def run_window(out: np.ndarray, _size: np.ndarray, image: np.ndarray, window: np.ndarray,
                       flags: np.ndarray) -> None:
            top, left = int(window[0]), int(window[1])
            resample_float(out, image[top : top + int(window[2]), left : left + int(window[3])], flags[0] != 0,
                           int(flags[1]))

        return run_window

    def run(out: np.ndarray, _size: np.ndarray, image: np.ndarray, flags: np.ndarray) -> None:
        resample_float(out, image, flags[0] != 0, int(flags[1]))

    return run


def resize_float_node(image: Any, size: Any, *, antialias: bool = True, window: Any = None, kind: int = 0,
                      device: Literal["cpu", "gpu"] = "cpu") -> Any:
    """A DALI node resizing each HWC RGB float32 sample by PIL's filter ``kind`` in float (a resize after Normalize).

    The filters' weights as float32 and the sums in float64 (:func:`~.resample.resample_float`), as torch's
    antialiased ``interpolate`` computes them (to float32 rounding) where torchvision resizes a float tensor; the
    same pixels on the CPU and the GPU.

    Args:
        image: the HWC RGB float32 node.
        size: the per-sample output size, a node of :func:`stallfree.transforms.spec.size_input` arrays.
        antialias: as :func:`resize_node`.
        window: as :func:`resize_node`.
        kind: PIL's filter, by its code in :data:`~.filters.FILTERS`.
        device: where the node runs (``image``'s device).
    """
    import nvidia.dali.types as types

    values = [float(antialias), float(kind)]
    if device == "gpu":
        return _gpu_node("float32", image, size, window, None, values, np.float32, chw=False)
    from stallfree.transforms.kernels.entries import (
        RESIZE_FLOAT_ENTRIES,  # compiles (or loads) the one entry point used
    )

    flags = types.Constant(np.array(values, np.float32), device="cpu")
    inputs = [size, image, flags] if window is None else [size, image, window, flags]
    operator = numba_operator(
        _run_float(window is not None),
        _setup,
        in_types=[np.uint8, np.float32, np.float32, np.float32][: len(inputs)],
        ins_ndim=[3, 3, 1, 1][: len(inputs)],
        out_type=np.float32,
        entries=RESIZE_FLOAT_ENTRIES[window is not None],
    )
    return operator(*inputs)


def _gpu_node(variant: str, image: Any, size: Any, window: Any, mirror: Any, flags: list[float], out_type: type,
              *, chw: bool) -> Any:
    """The GPU resampler's node (:data:`~.resample_cuda.KERNELS`): every input moved to the GPU, as DALI needs."""
    import nvidia.dali.types as types

    from stallfree.transforms.kernels.resample_cuda import KERNELS  # imports numba.cuda: GPU graphs only

    image_type = np.float32 if variant == "float32" else np.uint8
    inputs, kinds = [size.gpu(), image], [np.uint8, image_type]
    if window is not None:
        inputs, kinds = [*inputs, window.gpu()], [*kinds, np.float32]
    if variant == "normalize":
        flip = types.Constant(np.zeros(1, np.int32), device="gpu") if mirror is None else mirror.gpu()
        inputs, kinds = [*inputs, flip], [*kinds, np.int32]
    inputs, kinds = [*inputs, types.Constant(np.array(flags, np.float32), device="gpu")], [*kinds, np.float32]
    operator = numba_operator(
        KERNELS[(variant, window is not None)],
        _setup_chw if chw else _setup,
        in_types=kinds,
        ins_ndim=[3, 3] + [1] * (len(inputs) - 2),
        out_type=out_type,
        device="gpu",
        layout="CHW" if chw else "HWC",
    )
    return operator(*inputs)
