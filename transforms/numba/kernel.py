"""Numba augmentation kernels that run inside the DALI graph, on the CPU (``numba.njit``) or the GPU (``numba.cuda``).

A kernel is a *pixel function* in the Numba-compatible subset of Python::

    @kernel
    def solarize(out, image, y, x, threshold, apply):
        for c in range(image.shape[2]):
            v = image[y, x, c]
            out[y, x, c] = 255 - v if apply[0] != 0 and v >= threshold[0] else v

It sees the whole HWC ``image`` of one sample and that sample's parameters (each a 1-D array) and writes the output
pixel ``(y, x)``, every channel. One source serves both placements, which is why the unit is a pixel:

    CPU graph: numba.njit          for y in range(H): for x in range(W): pixel(...)      (one call per sample)
    GPU graph: numba.cuda kernel   a (y, x) grid-stride loop over the threads of one launch per sample

and both run inside DALI through ``numba_function``, so no sample goes back through Python. The parameters are
drawn on the host by the transform's ``draw`` from the sample-keyed generator and fed to the graph as inputs; a
kernel that needs noise gets a key among its parameters and calls :func:`uniform_at` / :func:`normal_at`, a
counter-based hash, so that its pixels are a pure function of its parameters too.

This module is the registry (:func:`kernel`, :class:`Kernel`, :class:`KernelTransform`); the CPU compiler is
:mod:`.cpu`, the CUDA compiler :mod:`.cuda`, and both become DALI nodes through :mod:`.dali`.
Compilation is eager: :meth:`Kernel.compile` (called when the graph is built, or by hand) compiles the kernel with
an explicit signature, and a kernel that Numba cannot compile raises :class:`KernelError` naming the kernel and
Numba's reason, before any batch runs. The CPU compile is cached on disk (:mod:`.kernel_cache`): a second process
loads it instead of compiling again.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from numba.extending import register_jitable
from nvidia.dali.pipeline import do_not_convert

from stallfree.core.mixer import GOLDEN, MIX1, MIX2
from stallfree.transforms.numba.cpu import KernelError, forwarder, pixel_loop
from stallfree.transforms.numba.cuda import grid_function, launch
from stallfree.transforms.numba.dali import GPU_BLOCKS, GPU_THREADS, numba_node
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["Kernel", "KernelError", "KernelTransform", "kernel", "normal_at", "uniform_at"]

ImageDtype = Literal["uint8", "float32"]


# In-kernel randomness: SplitMix64 over (key, counter), callable from njit and numba.cuda code alike.

_GOLDEN, _MIX1, _MIX2 = np.uint64(GOLDEN), np.uint64(MIX1), np.uint64(MIX2)  # stallfree.core.mixer's, inlined
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0  # 2 ** -53


@register_jitable
def uniform_at(key: int, counter: int) -> float:
    """A uniform in [0, 1), a pure function of ``(key, counter)`` (SplitMix64's finaliser)."""
    z = np.uint64(key) * _GOLDEN + np.uint64(counter) * _GOLDEN + _GOLDEN
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    z = z ^ (z >> _S31)
    return float(z >> _S11) * _INV53


@register_jitable
def normal_at(key: int, counter: int) -> float:
    """A standard normal, a pure function of ``(key, counter)`` (Box-Muller over two :func:`uniform_at` draws)."""
    u1 = 1.0 - uniform_at(key, 2 * counter)  # in (0, 1], so the log is finite
    u2 = uniform_at(key, 2 * counter + 1)
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


@dataclass(frozen=True, eq=False)
class Kernel:
    """A registered pixel function; see :func:`kernel`.

    Attributes:
        name: the kernel's name in messages.
        pixel: the Python pixel function ``pixel(out, image, y, x, *params)``.
        param_names: the names of its parameters after ``(out, image, y, x)``, in order.
    """

    name: str
    pixel: Callable[..., None]
    param_names: tuple[str, ...]
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    def compile(self, image_dtype: ImageDtype | type, param_dtypes: Sequence[type]) -> Any:
        """The CPU run function ``run(out, image, *params)``, compiled now (cached); :class:`KernelError` if not."""
        image_np = np.dtype(image_dtype).type
        return self._compiled(image_np, param_dtypes)[0]

    def _compiled(self, image_dtype: type, param_dtypes: Sequence[type]) -> tuple[Any, Any | None]:
        """``(run, DALI entry point or None)`` for these dtypes (:func:`~.cpu.pixel_loop`), compiled once."""
        key = ("cpu", image_dtype, tuple(param_dtypes))
        if key not in self._cache:
            self._check_arity(param_dtypes)
            self._cache[key] = pixel_loop(self.name, self.pixel, image_dtype, param_dtypes)
        return self._cache[key]

    def cuda_function(self) -> Callable[..., None]:
        """The GPU run function's Python source object, with the pixel function as a ``numba.cuda`` device function.

        DALI compiles it with ``numba.cuda`` when the GPU graph is built; :meth:`run_cuda` launches it directly.
        """
        if "gpu" not in self._cache:
            self._cache["gpu"] = grid_function(self.pixel, len(self.param_names))
        return self._cache["gpu"]

    def _check_arity(self, param_dtypes: Sequence[type]) -> None:
        if len(param_dtypes) != len(self.param_names):
            raise KernelError(
                f"kernel {self.name!r} takes parameters {list(self.param_names)}, but {len(param_dtypes)} dtypes "
                "were given; the transform's `params` must name them in the same order"
            )

    def __call__(self, image: np.ndarray, *params: np.ndarray) -> np.ndarray:
        """Run the CPU kernel outside DALI on one HWC image (for tests and for checking a kernel by hand)."""
        image = np.ascontiguousarray(image)
        arrays = [np.ascontiguousarray(np.atleast_1d(p)) for p in params]
        run = self.compile(image.dtype.type, [a.dtype.type for a in arrays])
        out = np.empty_like(image)
        run(out, image, *arrays)
        return out

    def run_cuda(
        self,
        image: np.ndarray,
        *params: np.ndarray,
        blocks: Sequence[int] = GPU_BLOCKS,
        threads_per_block: Sequence[int] = GPU_THREADS,
    ) -> np.ndarray:
        """Launch the ``numba.cuda`` kernel on one image (a GPU, or the simulator with ``NUMBA_ENABLE_CUDASIM=1``)."""
        image = np.ascontiguousarray(image)
        arrays = [np.ascontiguousarray(np.atleast_1d(p)) for p in params]
        self._check_arity([a.dtype.type for a in arrays])
        return launch(self.cuda_function(), image, arrays, blocks, threads_per_block)

    def node(self, image: Any, params: Sequence[Any], param_dtypes: Sequence[type], state: GraphState) -> Any:
        """The kernel as a DALI node on ``state.device``, compiled now."""
        image_dtype = np.dtype(state.dtype).type
        compiled, entry = self._compiled(image_dtype, param_dtypes)  # also checks the typing for a GPU graph
        entries = None
        if state.device == "gpu":
            run_fn = self.cuda_function()
        else:
            from stallfree.transforms.numba.abi import same_shape_setup  # loads its cached entry points

            run_fn = forwarder(compiled, len(param_dtypes))
            entries = None if entry is None else (entry, same_shape_setup)
        return numba_node(run_fn, image, params, image_dtype=image_dtype, param_dtypes=param_dtypes,
                          device=state.device, entries=entries)


def kernel(fn: Callable[..., None] | None = None, *, name: str | None = None) -> Any:
    """Register a pixel function ``fn(out, image, y, x, *params)`` as a :class:`Kernel`.

    ``out`` and ``image`` are the sample's HWC arrays (same shape and dtype), ``(y, x)`` the pixel to write (all
    channels), and each parameter a 1-D array of this sample's values, drawn on the host. Use it bare
    (``@kernel``) or with a name (``@kernel(name="tint")``). Nothing is compiled until the graph is built (or
    :meth:`Kernel.compile` is called); helpers the function calls must be ``numba.extending.register_jitable``
    so that they compile for the CPU and the GPU alike, as :func:`uniform_at` and :func:`normal_at` are.

    Raises:
        TypeError: ``fn`` does not take ``(out, image, y, x, ...)``.
    """

    def wrap(f: Callable[..., None]) -> Kernel:
        try:
            sig = inspect.signature(f)
        except (TypeError, ValueError) as err:
            raise TypeError(f"@kernel needs a Python function, got {f!r}") from err
        names = [p.name for p in sig.parameters.values()]
        kinds = {p.kind for p in sig.parameters.values()}
        if len(names) < 4 or kinds - {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY}:
            raise TypeError(
                f"kernel {f.__name__!r} must take (out, image, y, x, *params) as plain positional arguments, "
                f"got ({', '.join(names)})"
            )
        return Kernel(name or f.__name__, f, tuple(names[4:]))

    return wrap if fn is None else wrap(fn)


class KernelTransform(Transform):
    """A spec step that runs a :class:`Kernel`: subclass it as a frozen dataclass with ``kernel`` and ``params``.

    ``params`` maps each of the kernel's parameter names to ``np.float32`` or ``np.int32``; :meth:`sample`
    returns this sample's values for them (scalars or 1-D sequences), drawn from the sample's stream
    (``rng.random()``, ``rng.uniform(a, b)``, ``rng.integers(a, b)``...), given its current ``(height, width)``.
    Override :meth:`check` to refuse an image dtype (it runs when the graph is built).
    """

    kernel: ClassVar[Kernel]

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        """This sample's kernel parameters, by name."""
        raise NotImplementedError

    def check(self, state: GraphState) -> None:
        """Raise ``ValueError`` if the step cannot run on an image in ``state`` (e.g. a float image)."""

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        values = self.sample(rng, size)
        missing = set(self.params) - set(values)
        if missing:
            raise KeyError(f"{type(self).__name__}.sample() did not return {sorted(missing)}")
        return {n: np.atleast_1d(np.asarray(values[n], kind)) for n, kind in self.params.items()}, size

    def kernel_for(self, state: GraphState) -> Kernel:
        """The kernel for an image in ``state`` (override to pick a uint8 or a float variant)."""
        return type(self).kernel

    # A pipeline with conditionals (enable_conditionals=True, which the policies need) runs its definition through
    # DALI's AutoGraph; it must not rewrite the functions handed to Numba.
    @do_not_convert
    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        self.check(state)
        kern = self.kernel_for(state)
        names = self._names(kern)
        return kern.node(image, [params[n] for n in names], [self.params[n] for n in names], state), state

    def prepare(self, state: GraphState) -> None:
        """Check the step and compile its CPU kernel for an image in ``state`` now (``build`` does it too).

        A graph compiler calls this when the spec is checked, so that a kernel Numba cannot compile fails there.

        Raises:
            KernelError: Numba cannot compile the kernel.
            ValueError: the step cannot run on such an image.
        """
        self.check(state)
        kern = self.kernel_for(state)
        kern.compile(np.dtype(state.dtype).type, [self.params[n] for n in self._names(kern)])

    def _names(self, kern: Kernel) -> tuple[str, ...]:
        if set(kern.param_names) != set(self.params):
            raise KernelError(
                f"{type(self).__name__}.params names {sorted(self.params)} but kernel {kern.name!r} takes "
                f"{list(kern.param_names)}"
            )
        return kern.param_names

    def _outside(self, image: np.ndarray, params: Mapping[str, Any]) -> tuple[Kernel, np.ndarray, list[np.ndarray]]:
        image = np.ascontiguousarray(image)
        if image.dtype not in (np.uint8, np.float32) or image.ndim != 3:
            name = type(self).__name__
            raise ValueError(f"{name}: needs an HWC uint8 or float32 image, got {image.dtype} {image.shape}")
        state = GraphState("cpu", "uint8" if image.dtype == np.uint8 else "float32")
        self.check(state)
        kern = self.kernel_for(state)
        return kern, image, [np.asarray(params[n], self.params[n]) for n in self._names(kern)]

    def apply(self, image: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
        """Run the step's CPU kernel outside DALI on one HWC image, with parameters as :meth:`draw` returns them."""
        kern, image, arrays = self._outside(image, params)
        return kern(image, *arrays)

    def apply_cuda(self, image: np.ndarray, params: Mapping[str, Any], **launch: Sequence[int]) -> np.ndarray:
        """As :meth:`apply`, with the ``numba.cuda`` kernel (a GPU, or ``NUMBA_ENABLE_CUDASIM=1``)."""
        kern, image, arrays = self._outside(image, params)
        return kern.run_cuda(image, *arrays, **launch)
