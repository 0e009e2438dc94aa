"""The CPU operators' DALI entry points come from Numba's disk cache, so a new process does not compile them."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stallfree.transforms.kernels import color, entries, filters, resample
from stallfree.transforms.kernels.resample_node import _run, _setup
from stallfree.transforms.numba import abi, dali, disk_cache


@pytest.mark.slow
def test_a_new_process_loads_every_entry_point_from_the_cache() -> None:
    pairs = {*entries.RESIZE_ENTRIES.values(), *entries.JITTER_ENTRIES.values()}  # writes the cache if absent
    code = ("from stallfree.transforms.kernels import entries as a; "
            "fns = {f for table in (a.RESIZE_ENTRIES, a.JITTER_ENTRIES) for pair in table.values() for f in pair}; "
            "print(sum(f.cache_hits for f in fns), len(fns))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    hits, count = map(int, done.stdout.split()[-2:])
    assert count == len({f for pair in pairs for f in pair}) == 8
    assert hits == count, "every entry point was loaded, none compiled"


def test_the_resampler_operator_is_built_from_the_cached_entry_points() -> None:
    run, setup = entries.RESIZE_ENTRIES[(True, True)]
    dali.numba_operator(_run(True, True), _setup, in_types=[np.uint8, np.uint8, np.float32], ins_ndim=[3, 3, 1],
                              out_type=np.uint8, entries=(run, setup))
    built = [op for op in dali._OPERATORS.values() if isinstance(op, dali._precompiled_class())]
    assert any(op.run_fn == run.address and op.setup_fn == setup.address for op in built)


def test_color_jitter_on_the_cpu_builds_from_the_cached_entry_points() -> None:
    from stallfree.pipeline.graph import Graph
    from stallfree.transforms import ColorJitter, RandomResizedCrop
    from stallfree.transforms.compile import CompiledTransforms

    compiled = CompiledTransforms([RandomResizedCrop(8), ColorJitter(0.4, 0.4, 0.4, 0.1)], dtype="uint8", layout="NHWC")
    Graph(compiled, batch_size=2, num_threads=1, device_id=None, encoded=True)
    run, setup = entries.JITTER_ENTRIES[True]
    built = [op for op in dali._OPERATORS.values() if isinstance(op, dali._precompiled_class())]
    assert any(op.run_fn == run.address and op.setup_fn == setup.address for op in built)


def test_a_change_to_the_compiled_sources_drops_the_cached_entry_points(tmp_path) -> None:
    # Numba checks a cached cfunc against its own file's stamp only (entries.py); the resampler compiled into it
    # lives in resample.py. A changed resample.py used to leave a new process running the old machine code.
    mine = [tmp_path / "entries._resize-96.py311.nbi", tmp_path / "entries._resize-96.py311.1.nbc"]
    others = [tmp_path / "resample.resample-120.py311.nbi", tmp_path / "kernel.nbc"]
    for path in mine + others:
        path.write_bytes(b"cached")
    # no marker yet: compiled from unknown sources
    assert disk_cache.drop_stale_cache(tmp_path, "entries", "sources v1")
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)
    for path in mine:
        path.write_bytes(b"cached")
    assert not disk_cache.drop_stale_cache(tmp_path, "entries", "sources v1")  # the same sources: kept
    assert all(p.exists() for p in mine)
    assert disk_cache.drop_stale_cache(tmp_path, "entries", "sources v2")  # resample.py or color.py changed
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)
    assert (tmp_path / "entries.sources").read_text() == "sources v2"


@pytest.mark.parametrize(("module", "compiled_in"), [(resample, filters), (entries, filters), (entries, resample),
                                                     (entries, color), (entries, abi)])
def test_a_change_to_a_file_compiled_in_drops_the_cached_code(tmp_path, monkeypatch, module, compiled_in) -> None:
    # The resampler's sums (kernels/resample.py) compile in the filters of kernels/filters.py, which were one file
    # until issue 45: a changed filters.py must not leave a new process running the sums' old machine code.
    cache = tmp_path / "cache"
    cache.mkdir()
    copy = tmp_path / Path(compiled_in.__file__).name
    copy.write_bytes(Path(compiled_in.__file__).read_bytes())
    monkeypatch.setattr(compiled_in, "__file__", str(copy))
    monkeypatch.setattr(disk_cache, "numba_cache_folder", lambda function: cache)
    stem = Path(module.__file__).stem
    module._check_cache()  # marks the sources the cache holds
    cached = cache / f"{stem}._resample-220.py311.nbi"
    cached.write_bytes(b"cached")
    module._check_cache()
    assert cached.exists(), "unchanged sources: the cache is kept"
    copy.write_text(copy.read_text() + "\n# changed\n")
    module._check_cache()
    assert not cached.exists(), f"{compiled_in.__name__} changed: {stem}'s cached code is dropped"
