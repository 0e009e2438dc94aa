"""The CPU operators' DALI entry points come from Numba's disk cache, so a new process does not compile them."""

import subprocess
import sys

import numpy as np

from stallfree.transforms.numba import abi, dali
from stallfree.transforms.resample import _run, _setup


def test_a_new_process_loads_every_entry_point_from_the_cache() -> None:
    entries = {*abi.RESIZE_ENTRIES.values(), *abi.JITTER_ENTRIES.values()}  # writes the cache if absent
    code = ("from stallfree.transforms.numba import abi as a; "
            "fns = {f for table in (a.RESIZE_ENTRIES, a.JITTER_ENTRIES) for pair in table.values() for f in pair}; "
            "print(sum(f.cache_hits for f in fns), len(fns))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    hits, count = map(int, done.stdout.split()[-2:])
    assert count == len({f for pair in entries for f in pair}) == 8
    assert hits == count, "every entry point was loaded, none compiled"


def test_the_resampler_operator_is_built_from_the_cached_entry_points() -> None:
    run, setup = abi.RESIZE_ENTRIES[(True, True)]
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
    run, setup = abi.JITTER_ENTRIES[True]
    built = [op for op in dali._OPERATORS.values() if isinstance(op, dali._precompiled_class())]
    assert any(op.run_fn == run.address and op.setup_fn == setup.address for op in built)


def test_a_change_to_the_compiled_sources_drops_the_cached_entry_points(tmp_path) -> None:
    # Numba checks a cached cfunc against abi.py's stamp only; the resampler compiled into it lives in
    # resample.py. A changed resample.py used to leave a new process running the old machine code.
    mine = [tmp_path / "abi._resize-96.py311.nbi", tmp_path / "abi._resize-96.py311.1.nbc"]
    others = [tmp_path / "resample.resample-120.py311.nbi", tmp_path / "kernel.nbc"]
    for path in mine + others:
        path.write_bytes(b"cached")
    assert abi.drop_stale_cache(tmp_path, "sources v1")  # no marker yet: compiled from unknown sources
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)
    for path in mine:
        path.write_bytes(b"cached")
    assert not abi.drop_stale_cache(tmp_path, "sources v1")  # the same sources: kept
    assert all(p.exists() for p in mine)
    assert abi.drop_stale_cache(tmp_path, "sources v2")  # resample.py or color.py changed
    assert not any(p.exists() for p in mine) and all(p.exists() for p in others)
    assert (tmp_path / "abi.sources").read_text() == "sources v2"
