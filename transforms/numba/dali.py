"""DALI's ``numba_function`` nodes: a per-sample run function (CPU) or CUDA function (GPU) as a graph operator.

Every Numba operator of the graph goes through here: the user's kernels (:mod:`.kernel`), ColorJitter's kernel
(:mod:`~stallfree.transforms.ops.color`) and the resampler (:mod:`~stallfree.transforms.kernels.resample_node`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

from stallfree.transforms.dali_types import dali_type

__all__ = ["GPU_BLOCKS", "GPU_THREADS", "numba_node", "numba_operator"]

#: Launch shape of a GPU pixel kernel: grid-stride, so any shape is correct; this one covers 256 x 256 per stride.
GPU_BLOCKS = (8, 32, 1)
GPU_THREADS = (32, 8, 1)


def _setup_same_shape(outs: Any, ins: Any) -> None:
    # DALI needs the output shape when out and in types differ in count; the image keeps its shape.
    for i in range(len(outs[0])):
        for d in range(len(outs[0][i])):
            outs[0][i][d] = ins[0][i][d]


#: DALI compiles a NumbaFunction operator's wrappers when it is constructed (seconds each), so each configuration
#: is constructed once per process and called in every graph that uses it (each Loader, each rebuilt graph).
_OPERATORS: dict[tuple[Any, ...], Any] = {}
_PRECOMPILED: list[type] = []  # the NumbaFunction subclass taking cached entry points, made once


def _precompiled_class() -> type:
    """``NumbaFunction`` built from given C entry points (Numba ``cfunc``s) instead of compiling its own.

    DALI's own wrappers cannot be cached (see :mod:`.abi`); this overrides the two methods that make them.
    """
    if not _PRECOMPILED:
        from nvidia.dali.plugin.numba.experimental import NumbaFunction

        for method in ("_get_run_fn_cpu", "_get_setup_fn_cpu"):
            if not callable(getattr(NumbaFunction, method, None)):
                raise RuntimeError(f"this DALI's NumbaFunction has no {method}, which stallfree's cached Numba "
                                   "entry points replace (checked with DALI 2.4); report this DALI version")

        class Precompiled(NumbaFunction):
            entries: tuple[Any, Any]

            def __init__(self, entries: tuple[Any, Any], **kwargs: Any):
                self.entries = entries
                super().__init__(**kwargs)

            def _get_run_fn_cpu(self, *args: Any) -> int:
                return int(self.entries[0].address)

            def _get_setup_fn_cpu(self, setup_fn: Any) -> int:
                return int(self.entries[1].address)

        _PRECOMPILED.append(Precompiled)
    return _PRECOMPILED[0]


def numba_operator(
    run_fn: Callable[..., None],
    setup_fn: Callable[[Any, Any], None],
    *,
    in_types: Sequence[type],
    ins_ndim: Sequence[int],
    out_type: type,
    device: Literal["cpu", "gpu"] = "cpu",
    blocks: Sequence[int] = GPU_BLOCKS,
    threads_per_block: Sequence[int] = GPU_THREADS,
    entries: tuple[Any, Any] | None = None,
    layout: str = "HWC",
) -> Any:
    """DALI's ``NumbaFunction`` operator with one 3-D output laid out ``layout``, constructed once per configuration.

    Call the result on the input nodes inside a pipeline definition; it gives the output node, laid out ``layout``
    (``numba_function``'s own output carries no layout). ``run_fn`` and ``setup_fn`` must be the same objects from
    one call to the next for the cache to serve them. ``entries``: for a CPU operator, ``(run, setup)`` Numba
    ``cfunc``s of DALI's C interface, cached on disk (:mod:`.abi`), used instead of compiling ``run_fn``
    and ``setup_fn`` in every process.
    """
    launch = (tuple(blocks), tuple(threads_per_block))
    key = (run_fn, setup_fn, tuple(in_types), tuple(ins_ndim), out_type, device, launch)
    if key not in _OPERATORS:
        from nvidia.dali.plugin.numba.experimental import NumbaFunction

        kwargs: dict[str, Any] = {}
        if device == "gpu":
            kwargs = {"blocks": list(blocks), "threads_per_block": list(threads_per_block)}
        make: Callable[..., Any] = NumbaFunction
        if entries is not None and device == "cpu":
            make = functools.partial(_precompiled_class(), entries)
        _OPERATORS[key] = make(
            run_fn=run_fn,
            setup_fn=setup_fn,
            in_types=[dali_type(t) for t in in_types],
            out_types=[dali_type(out_type)],
            ins_ndim=list(ins_ndim),
            outs_ndim=[3],
            batch_processing=False,
            device=device,
            **kwargs,
        )
    operator = _OPERATORS[key]

    def node(*inputs: Any) -> Any:
        import nvidia.dali.fn as fn

        return fn.reshape(operator(*inputs), layout=layout)

    return node


def numba_node(
    run_fn: Callable[..., None],
    image: Any,
    params: Sequence[Any],
    *,
    image_dtype: type,
    param_dtypes: Sequence[type],
    device: Literal["cpu", "gpu"],
    blocks: Sequence[int] = GPU_BLOCKS,
    threads_per_block: Sequence[int] = GPU_THREADS,
    entries: tuple[Any, Any] | None = None,
) -> Any:
    """A DALI ``numba_function`` node computing ``run_fn(out, image, *params)``; ``out`` has the image's shape.

    Args:
        run_fn: a plain Python function: per sample on the CPU (DALI njit-compiles it), a CUDA kernel body on the
            GPU (DALI compiles it with ``numba.cuda`` and launches it once per sample on ``blocks`` x
            ``threads_per_block``).
        image: the HWC image node.
        params: per-sample parameter nodes, 1-D each (at most five).
        image_dtype: NumPy dtype of the image (and of the output).
        param_dtypes: NumPy dtype of each parameter.
        device: where the node runs; parameters are moved to the GPU for a GPU node.
        blocks: GPU grid shape.
        threads_per_block: GPU block shape.
        entries: cached CPU entry points of DALI's C interface (:mod:`.abi`) used instead of compiling
            ``run_fn`` (``run_fn`` must then be the same object each call: it keys the operator cache).
    """
    if len(params) > 5:
        raise ValueError(f"a kernel takes at most 5 parameter arrays (DALI's limit is 6 inputs), got {len(params)}")
    operator = numba_operator(
        run_fn,
        _setup_same_shape,
        in_types=[image_dtype, *param_dtypes],
        ins_ndim=[3] + [1] * len(params),
        out_type=image_dtype,
        device=device,
        blocks=blocks,
        threads_per_block=threads_per_block,
        entries=entries,
    )
    return operator(image, *(p.gpu() if device == "gpu" else p for p in params))

