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

Compilation is eager: :meth:`Kernel.compile` (called when the graph is built, or by hand) compiles the kernel with
an explicit signature, and a kernel that Numba cannot compile raises :class:`KernelError` naming the kernel and
Numba's reason, before any batch runs.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from numba.extending import register_jitable
from nvidia.dali.pipeline import do_not_convert

from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform, dali_type

__all__ = [
    "Kernel",
    "KernelError",
    "KernelTransform",
    "compile_cpu",
    "forwarder",
    "kernel",
    "normal_at",
    "numba_node",
    "numba_operator",
    "uniform_at",
]

ImageDtype = Literal["uint8", "float32"]
_NUMBA_TYPES: dict[Any, str] = {np.uint8: "uint8", np.float32: "float32", np.float64: "float64", np.int32: "int32"}
#: Launch shape of a GPU pixel kernel: grid-stride, so any shape is correct; this one covers 256 x 256 per stride.
GPU_BLOCKS = (8, 32, 1)
GPU_THREADS = (32, 8, 1)


class KernelError(ValueError):
    """A kernel that Numba cannot compile (or cannot run on the image it is given); names the kernel."""


# ---------------------------------------------------------------------------------------------------------------
# In-kernel randomness: SplitMix64 over (key, counter), callable from njit and numba.cuda code alike.

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
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


# ---------------------------------------------------------------------------------------------------------------
# Wrapping a per-sample run function (CPU) or CUDA function (GPU) as a DALI numba_function node.


def _setup_same_shape(outs: Any, ins: Any) -> None:
    # DALI needs the output shape when out and in types differ in count; the image keeps its shape.
    for i in range(len(outs[0])):
        for d in range(len(outs[0][i])):
            outs[0][i][d] = ins[0][i][d]


#: DALI compiles a NumbaFunction operator's wrappers when it is constructed (seconds each), so each configuration
#: is constructed once per process and called in every graph that uses it (each Loader, each rebuilt graph).
_OPERATORS: dict[tuple[Any, ...], Any] = {}


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
) -> Any:
    """DALI's ``NumbaFunction`` operator with one HWC output, constructed (compiled) once per configuration.

    Call the result on the input nodes inside a pipeline definition; it gives the output node, laid out ``HWC``
    (``numba_function``'s own output carries no layout). ``run_fn`` and ``setup_fn`` must be the same objects from
    one call to the next for the cache to serve them.
    """
    launch = (tuple(blocks), tuple(threads_per_block))
    key = (run_fn, setup_fn, tuple(in_types), tuple(ins_ndim), out_type, device, launch)
    if key not in _OPERATORS:
        from nvidia.dali.plugin.numba.experimental import NumbaFunction

        kwargs: dict[str, Any] = {}
        if device == "gpu":
            kwargs = {"blocks": list(blocks), "threads_per_block": list(threads_per_block)}
        _OPERATORS[key] = NumbaFunction(
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

        return fn.reshape(operator(*inputs), layout="HWC")

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
    )
    return operator(image, *(p.gpu() if device == "gpu" else p for p in params))


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


def compile_cpu(name: str, run_fn: Callable[..., None], image_dtype: type, param_dtypes: Sequence[type]) -> Any:
    """``numba.njit`` ``run_fn(out, image, *params)`` with an explicit signature, now; :class:`KernelError` if not."""
    import numba

    try:
        return numba.njit(_signature(image_dtype, param_dtypes), cache=False)(run_fn)
    except Exception as err:  # Numba raises TypingError, LoweringError, UnsupportedError, NotImplementedError...
        raise KernelError(
            f"kernel {name!r} does not compile with numba.njit for a {np.dtype(image_dtype).name} image and "
            f"parameters {[np.dtype(d).name for d in param_dtypes]}: {_numba_reason(err)}"
        ) from err


@functools.cache
def forwarder(compiled: Any, nargs: int) -> Callable[..., None]:
    """A plain Python function calling ``compiled`` (DALI njit-compiles its run function itself).

    Cached, so that the same compiled kernel always gets the same function and :func:`numba_node` reuses its operator.
    """
    args = ", ".join(["out", "image"] + [f"p{i}" for i in range(nargs)])
    namespace: dict[str, Any] = {"_compiled": compiled}
    exec(f"def run({args}):\n    _compiled({args})\n", namespace)  # noqa: S102  (fixed template, no user text)
    return namespace["run"]


# ---------------------------------------------------------------------------------------------------------------
# The user-facing kernel: a pixel function, expanded into a CPU loop and a CUDA grid-stride kernel.

_CPU_TEMPLATE = """
def run({args}):
    for y in range(out.shape[0]):
        for x in range(out.shape[1]):
            _pixel({args_yx})
"""
_GPU_TEMPLATE = """
def run({args}):
    x0, y0 = _cuda.grid(2)
    sx, sy = _cuda.gridsize(2)
    for y in range(y0, out.shape[0], sy):
        for x in range(x0, out.shape[1], sx):
            _pixel({args_yx})
"""


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

    def _source(self, template: str) -> str:
        names = ["out", "image"] + [f"p{i}" for i in range(len(self.param_names))]
        yx = names[:2] + ["y", "x"] + names[2:]
        return template.format(args=", ".join(names), args_yx=", ".join(yx))

    def compile(self, image_dtype: ImageDtype | type, param_dtypes: Sequence[type]) -> Any:
        """The CPU run function ``run(out, image, *params)``, compiled now (cached); :class:`KernelError` if not."""
        import numba

        image_np = np.dtype(image_dtype).type
        key = ("cpu", image_np, tuple(param_dtypes))
        if key not in self._cache:
            self._check_arity(param_dtypes)
            namespace: dict[str, Any] = {"_pixel": numba.njit(inline="always")(self.pixel)}  # 5-10x faster loops
            exec(self._source(_CPU_TEMPLATE), namespace)  # noqa: S102  (fixed template, no user text)
            self._cache[key] = compile_cpu(self.name, namespace["run"], image_np, param_dtypes)
        return self._cache[key]

    def cuda_function(self) -> Callable[..., None]:
        """The GPU run function's Python source object, with the pixel function as a ``numba.cuda`` device function.

        DALI compiles it with ``numba.cuda`` when the GPU graph is built; :meth:`run_cuda` launches it directly.
        """
        if "gpu" not in self._cache:
            from numba import cuda

            namespace: dict[str, Any] = {"_pixel": cuda.jit(device=True)(self.pixel), "_cuda": cuda}
            exec(self._source(_GPU_TEMPLATE), namespace)  # noqa: S102  (fixed template, no user text)
            self._cache["gpu"] = namespace["run"]
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
        from numba import cuda

        image = np.ascontiguousarray(image)
        arrays = [np.ascontiguousarray(np.atleast_1d(p)) for p in params]
        self._check_arity([a.dtype.type for a in arrays])
        out = np.empty_like(image)
        cuda.jit(self.cuda_function())[tuple(blocks[:2]), tuple(threads_per_block[:2])](out, image, *arrays)
        return out

    def node(self, image: Any, params: Sequence[Any], param_dtypes: Sequence[type], state: GraphState) -> Any:
        """The kernel as a DALI node on ``state.device``, compiled now."""
        image_dtype = np.dtype(state.dtype).type
        compiled = self.compile(image_dtype, param_dtypes)  # also checks the typing when the graph is on the GPU
        if state.device == "gpu":
            run_fn = self.cuda_function()
        else:
            run_fn = forwarder(compiled, len(param_dtypes))
        return numba_node(
            run_fn, image, params, image_dtype=image_dtype, param_dtypes=param_dtypes, device=state.device
        )


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
