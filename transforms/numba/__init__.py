"""The Numba machinery: kernels compiled for the CPU (``numba.njit``) and the GPU (``numba.cuda``), run inside DALI.

``kernel`` is the registry users write pixel functions with; ``cpu`` and ``cuda`` compile them; ``dali`` makes any
Numba function a graph operator; ``abi`` is DALI's C interface for operators whose entry points are cached on disk,
and ``kernel_cache`` caches a user's kernel the same way. Nothing is imported here: each module is imported by name.
"""

__all__: list[str] = []
