"""A ``@kernel``'s CPU operator comes from Numba's disk cache in a new process, and a change to what it depends on
compiles it again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallfree.transforms.numba import kernel_cache
from stallfree.transforms.numba.cpu import pixel_loop
from stallfree.transforms.numba.kernel import kernel

_KERNEL_FILE = '''
import numpy as np
from numba.extending import register_jitable
from stallfree.transforms import kernel

GAIN = {gain}

@register_jitable
def _scale(v, g):
    return min(255.0, v * g)

@kernel
def tint(out, image, y, x, gain):
    for c in range(image.shape[2]):
        out[y, x, c] = np.uint8(_scale(image[y, x, c], gain[0] * GAIN))
'''

_RUN = '''
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from user_kernel import tint
from stallfree.transforms.numba.kernel_cache import cached_kernel
run, entry = cached_kernel(tint.name, tint.pixel, np.uint8, [np.float32])
image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3) * 10
out = np.empty_like(image)
run(out, image, np.array([1.5], np.float32))
print(sum(run.stats.cache_hits.values()), entry.cache_hits, " ".join(map(str, out.ravel())))
'''


def _run_in_new_process(folder: Path) -> tuple[int, int, list[int]]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}  # the cache beside the kernel's file
    done = subprocess.run([sys.executable, "-c", _RUN, str(folder)], capture_output=True, text=True, timeout=300,
                          check=True, env=env)
    run_hits, entry_hits, *pixels = done.stdout.split()
    return int(run_hits), int(entry_hits), [int(p) for p in pixels]


@pytest.mark.slow
def test_a_new_process_loads_a_users_kernel_from_the_cache_and_an_edit_compiles_again(tmp_path: Path) -> None:
    source = tmp_path / "user_kernel.py"
    source.write_text(_KERNEL_FILE.format(gain=1.0))
    expected = [min(255, int(v * 10 * 1.5)) for v in range(18)]
    assert _run_in_new_process(tmp_path) == (0, 0, expected)  # compiled, and written to the cache
    assert _run_in_new_process(tmp_path) == (1, 1, expected)  # loop and entry point both loaded
    source.write_text(_KERNEL_FILE.format(gain=0.5))  # a global the kernel reads changed
    halved = [min(255, int(v * 10 * 0.75)) for v in range(18)]
    assert _run_in_new_process(tmp_path) == (0, 0, halved)
    generated = sorted((tmp_path / "__pycache__" / "stallfree_kernels").glob("k*.py"))
    assert len(generated) == 2, "one generated module per version of the kernel"


def _pixel(body: str, namespace: dict[str, Any] | None = None) -> Any:
    namespace = {"np": np, **(namespace or {})}
    exec(textwrap.dedent(body), namespace)  # noqa: S102 - the tests' own fixed source
    return namespace["pixel"]


_BODY = """
def pixel(out, image, y, x, k):
    for c in range(image.shape[2]):
        out[y, x, c] = helper(image[y, x, c], k[0])
"""


def _helper(offset: int) -> Any:
    return _pixel(f"def pixel(v, k):\n    return (v + k + {offset}) % 256\n")  # named pixel: _pixel returns it


def test_the_fingerprint_follows_the_body_the_helpers_and_the_constants() -> None:
    base = kernel_cache.fingerprint(_pixel(_BODY, {"helper": _helper(1)}))
    assert base is not None
    assert kernel_cache.fingerprint(_pixel(_BODY, {"helper": _helper(1)})) == base, "same code, same hash"
    assert kernel_cache.fingerprint(_pixel(_BODY, {"helper": _helper(2)})) != base, "a helper's edit is seen"
    assert kernel_cache.fingerprint(_pixel(_BODY.replace("k[0]", "k[0] + 1"), {"helper": _helper(1)})) != base
    constant = "def pixel(out, image, y, x, k):\n    out[y, x, 0] = LIMIT\n"
    assert kernel_cache.fingerprint(_pixel(constant, {"LIMIT": 3})) != kernel_cache.fingerprint(
        _pixel(constant, {"LIMIT": 4}))
    table = "def pixel(out, image, y, x, k):\n    out[y, x, 0] = TABLE[0]\n"
    first = kernel_cache.fingerprint(_pixel(table, {"TABLE": np.array([1, 2], np.uint8)}))
    assert first != kernel_cache.fingerprint(_pixel(table, {"TABLE": np.array([1, 3], np.uint8)}))


def test_a_kernel_the_hash_cannot_describe_is_compiled_as_before_with_the_same_pixels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Settings:
        gain = 2

    body = "def pixel(out, image, y, x, k):\n    for c in range(3):\n        out[y, x, c] = image[y, x, c] * K\n"
    assert kernel_cache.fingerprint(_pixel(body, {"K": 2})) is not None
    assert kernel_cache.fingerprint(_pixel(body, {"K": Settings()})) is None, "an object it cannot describe"
    assert kernel_cache.fingerprint(_pixel(body, {"K": [2]})) is None, "a list: its items may change"
    monkeypatch.setattr(kernel_cache, "fingerprint", lambda pixel: None)
    run, entry = pixel_loop("uncached", _pixel(body, {"K": 2}), np.uint8, [np.int32])
    assert entry is None, "DALI compiles its own wrapper, as before the cache"
    image = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    out = np.empty_like(image)
    run(out, image, np.zeros(1, np.int32))
    np.testing.assert_array_equal(out, image * 2)


@kernel
def _invert(out, image, y, x, amount):  # noqa: ANN001, ANN201 - Numba-compiled
    for c in range(image.shape[2]):
        out[y, x, c] = amount[0] - image[y, x, c]


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_the_cached_operator_matches_the_python_pixel_function(dtype: type) -> None:
    image = np.random.default_rng(0).integers(0, 200, (5, 7, 3)).astype(dtype)
    amount = np.array([250], dtype)
    expected = np.empty_like(image)
    for y in range(5):
        for x in range(7):
            _invert.pixel(expected, image, y, x, amount)
    np.testing.assert_array_equal(_invert(image, amount), expected)
    assert kernel_cache.cached_kernel(_invert.name, _invert.pixel, dtype, [dtype]) is not None


def test_a_cpu_graph_builds_a_kernel_from_its_cached_entry_point() -> None:
    from stallfree.pipeline.graph import Graph
    from stallfree.transforms import RandomPosterize, Resize
    from stallfree.transforms.compile import CompiledTransforms
    from stallfree.transforms.numba.dali import _OPERATORS, _precompiled_class

    compiled = CompiledTransforms([Resize((8, 8)), RandomPosterize(3, p=1.0)], dtype="uint8", layout="NHWC")
    Graph(compiled, batch_size=2, num_threads=1, device_id=None, encoded=True)
    posterize = RandomPosterize.kernel
    _, entry = kernel_cache.cached_kernel(posterize.name, posterize.pixel, np.uint8, [np.int32, np.int32]) or (0, 0)
    built = [op for op in _OPERATORS.values() if isinstance(op, _precompiled_class())]
    assert any(op.run_fn == entry.address for op in built)
