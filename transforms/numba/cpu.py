"""The CPU compiler of a kernel: ``numba.njit`` with an explicit signature, now, and a readable error if not.

A pixel function ``pixel(out, image, y, x, *params)`` becomes ``run(out, image, *params)`` looping over the
pixels of one sample; DALI's CPU ``numba_function`` calls it once per sample.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["KernelError", "compile_cpu", "forwarder", "kernel_error", "pixel_loop"]

_NUMBA_TYPES: dict[Any, str] = {np.uint8: "uint8", np.float32: "float32", np.float64: "float64", np.int32: "int32"}


class KernelError(ValueError):
    """A kernel that Numba cannot compile (or cannot run on the image it is given); names the kernel."""


_CPU_TEMPLATE = """
def run({args}):
    for y in range(out.shape[0]):
        for x in range(out.shape[1]):
            _pixel({args_yx})
"""


def expand(template: str, nparams: int, namespace: dict[str, Any]) -> Callable[..., None]:
    """``template`` (a ``run`` calling ``_pixel``) for ``nparams`` parameters, defined in ``namespace``."""
    names = ["out", "image"] + [f"p{i}" for i in range(nparams)]
    yx = names[:2] + ["y", "x"] + names[2:]
    exec(template.format(args=", ".join(names), args_yx=", ".join(yx)), namespace)  # noqa: S102  (fixed template)
    return namespace["run"]


def pixel_loop(name: str, pixel: Callable[..., None], image_dtype: type,
               param_dtypes: Sequence[type]) -> tuple[Any, Any | None]:
    """``(run, entry)``: ``run(out, image, *params)`` calling ``pixel`` at every ``(y, x)``, and DALI's C entry.

    Both come from Numba's disk cache once the kernel was compiled (:mod:`.kernel_cache`); a kernel that cannot be
    cached gets ``run`` njit-compiled now in this process and no entry point (DALI then compiles its own wrapper).
    """
    import numba

    from stallfree.transforms.numba.kernel_cache import cached_kernel

    try:
        cached = cached_kernel(name, pixel, image_dtype, param_dtypes)
    except Exception as err:  # Numba raises TypingError, LoweringError, UnsupportedError, NotImplementedError...
        raise kernel_error(name, image_dtype, param_dtypes, err) from err
    if cached is not None:
        return cached
    namespace: dict[str, Any] = {"_pixel": numba.njit(inline="always")(pixel)}  # 5-10x faster loops
    return compile_cpu(name, expand(_CPU_TEMPLATE, len(param_dtypes), namespace), image_dtype, param_dtypes), None


def _signature(image_dtype: type, param_dtypes: Sequence[type]) -> str:
    image = f"{_NUMBA_TYPES[image_dtype]}[:, :, ::1]"
    args = [image, image] + [f"{_NUMBA_TYPES[d]}[::1]" for d in param_dtypes]
    return f"void({', '.join(args)})"


_NOISE = (
    "Failed in", "No implementation of function", ">>>", "There are", "- Of which", "Overload in function",
    "With argument", "Rejected as", "TypingError: Failed", "During:", "raised from", "<source elided>",
)


def _numba_reason(err: BaseException) -> str:
    """The innermost reason in Numba's nested error report, with the source line it points at."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    kept = [(i, line) for i, line in enumerate(lines) if not line.startswith(_NOISE) and not line.startswith("File ")]
    if not kept:
        return " ".join(lines[:3]) if lines else repr(err)
    i, reason = kept[0]
    if reason.startswith("Overload of function"):  # a built-in without a matching signature: show the call
        calls = [line for line in lines[:i] if line.startswith(">>>")]
        reason = f"no implementation of {calls[-1][3:].strip()}" if calls else reason
    where = next((line for line in lines[i + 1 :] if line.startswith("File ")), "")
    return f"{reason} ({where.rstrip(':')})" if where else reason


def kernel_error(name: str, image_dtype: type, param_dtypes: Sequence[type], err: BaseException) -> KernelError:
    """The :class:`KernelError` for Numba's ``err`` compiling kernel ``name`` for these dtypes."""
    return KernelError(
        f"kernel {name!r} does not compile with numba.njit for a {np.dtype(image_dtype).name} image and "
        f"parameters {[np.dtype(d).name for d in param_dtypes]}: {_numba_reason(err)}"
    )


def compile_cpu(name: str, run_fn: Callable[..., None], image_dtype: type, param_dtypes: Sequence[type]) -> Any:
    """``numba.njit`` ``run_fn(out, image, *params)`` with an explicit signature, now; :class:`KernelError` if not."""
    import numba

    try:
        return numba.njit(_signature(image_dtype, param_dtypes), cache=False)(run_fn)
    except Exception as err:  # Numba raises TypingError, LoweringError, UnsupportedError, NotImplementedError...
        raise kernel_error(name, image_dtype, param_dtypes, err) from err


@functools.cache
def forwarder(compiled: Any, nargs: int) -> Callable[..., None]:
    """A plain Python function calling ``compiled`` (DALI njit-compiles its run function itself).

    Cached, so that the same compiled kernel always gets the same function and :func:`~.dali.numba_node` reuses its
    operator.
    """
    args = ", ".join(["out", "image"] + [f"p{i}" for i in range(nargs)])
    namespace: dict[str, Any] = {"_compiled": compiled}
    exec(f"def run({args}):\n    _compiled({args})\n", namespace)  # noqa: S102  (fixed template, no user text)
    return namespace["run"]

