"""The differential stalls, the what-ifs and the profile.json schema check, on figures chosen by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from stallfree.stage_runtime.profile_chart import title
from stallfree.stage_runtime.profile_phases import InMemoryReader, measure_storage
from stallfree.stage_runtime.profile_report import check_schema, differential_stalls, headline, what_ifs


@pytest.mark.parametrize(("ideal", "cached", "real", "measured", "bottleneck", "fetch", "prep"), [
    (0.010, 0.010, 0.040, 0.75, "fetch", 0.75, 0.0),
    (0.010, 0.040, 0.040, 0.75, "preparation", 0.0, 0.75),
    (0.010, 0.020, 0.040, 0.75, "fetch", 0.5, 0.25),
    (0.040, 0.041, 0.041, 0.01, "compute", 0.0, 0.01),
])
def test_differential_stalls(ideal: float, cached: float, real: float, measured: float, bottleneck: str,
                             fetch: float, prep: float) -> None:
    stalls = differential_stalls(ideal, cached, real, measured, "v")
    assert stalls.bottleneck == bottleneck
    assert stalls.fetch_stall_share == pytest.approx(fetch, abs=1e-3)
    assert stalls.prep_stall_share == pytest.approx(prep, abs=1e-3)
    assert stalls.notes == []


def test_a_compute_bound_run_names_no_stall() -> None:
    # Regression (issue 10, item 22): a run that waited 0% reported "fetch stall 50%" in its headline and PNG
    # title, because the real run's step was twice the one from memory (the step ran slower beside the loader).
    stalls = differential_stalls(0.010, 0.010, 0.020, 0.0, "not input-bound", fallback="compute")
    assert stalls.fetch_diff_share == pytest.approx(0.5)
    assert stalls.fetch_stall_share == stalls.prep_stall_share == 0.0
    assert stalls.bottleneck == "compute" and "the loop waited 0%" in stalls.notes[0]
    line = headline(vars(stalls))
    assert line == "bottleneck: compute (not input-bound: the loop waited 0.0% of step time)"
    result = {"model": "mlp", "device": "cpu", "batch_size": 4, "stalls": vars(stalls)}
    assert "stall" not in title(result).replace("not input-bound", "") and "fetch" not in title(result)


def test_the_stalls_split_the_measured_wait() -> None:
    # Regression (issue 10, item 22): a preparation-bound run reported 83% + 6% against 67% waited.
    stalls = differential_stalls(0.11, 0.94, 1.0, 0.67, "highly input-bound")
    assert (stalls.fetch_diff_share, stalls.prep_diff_share) == pytest.approx((0.06, 0.83))
    assert stalls.fetch_stall_share + stalls.prep_stall_share == pytest.approx(0.67)
    assert stalls.prep_stall_share / stalls.fetch_stall_share == pytest.approx(0.83 / 0.06)
    assert "differ by 89%" in stalls.notes[0]
    assert headline(vars(stalls)) == ("bottleneck: preparation (highly input-bound: the loop waited 67% of step "
                                      "time: fetch stall 5%, preparation stall 62%)")


def test_no_difference_splits_the_wait_as_the_real_run_did() -> None:
    stalls = differential_stalls(0.02, 0.02, 0.02, 0.3, "highly input-bound", fallback="preparation",
                                 fallback_shares=(0.1, 0.2))
    assert (stalls.fetch_stall_share, stalls.prep_stall_share) == pytest.approx((0.1, 0.2))
    assert stalls.bottleneck == "preparation"


_STEP = st.floats(1e-4, 10.0)


@given(ideal=_STEP, cached=_STEP, real=_STEP, measured=st.floats(0.0, 1.0),
       fallback=st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.5)))
def test_stalls_never_exceed_the_wait_and_the_headline_names_only_a_wait(
        ideal: float, cached: float, real: float, measured: float, fallback: tuple[float, float]) -> None:
    stalls = differential_stalls(ideal, cached, real, measured, "v", fallback_shares=fallback)
    total = stalls.fetch_stall_share + stalls.prep_stall_share
    assert min(stalls.fetch_stall_share, stalls.prep_stall_share) >= 0
    assert total == pytest.approx(measured) or total == 0.0
    if measured < 0.05:
        assert stalls.bottleneck == "compute" and "stall" not in headline(vars(stalls))


def test_noisy_runs_are_flagged() -> None:
    stalls = differential_stalls(0.5, 0.5, 0.2, 0.3, "v", fallback="preparation")
    assert stalls.bottleneck == "preparation" and "noisy" in stalls.notes[0]
    with pytest.raises(ValueError, match="step times must be positive, got ideal 0"):
        differential_stalls(0, 1, 1, 0, "v")


def _images(tmp_path: Path, sizes: list[tuple[int, int]]) -> list[Path]:
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", size).save(path)
        paths.append(path)
    return paths


def test_what_ifs(tmp_path: Path) -> None:
    paths = _images(tmp_path, [(512, 256), (128, 128)])
    out = what_ifs(batch_size=10, cores=2, ideal_step_s=0.01, prep_points=[(1, 250.0), (2, 500.0)],
                   fetch_step_s=0.04, dataset_bytes=3 * 2**30, available_bytes=2**30, total_bytes=4 * 2**30,
                   paths=paths, max_side=256)
    # The step eats 1,000 img/s; 2 threads make 500, 250 per core: 4 cores.
    assert out["cores"]["needed_to_remove_prep_stall"] == 4 and "extrapolated" in out["cores"]["how"]
    assert out["page_cache"]["fits"] is False
    assert out["page_cache"]["more_memory_needed_bytes"] == int(2 * 2**30 * 1.1)
    # (512x256 -> 256x128) and 128x128 unchanged: (32768 + 16384) / (131072 + 16384) of the pixels.
    assert out["max_side"]["pixel_ratio"] == pytest.approx(49152 / 147456)
    assert out["max_side"]["speedup"] == pytest.approx(0.04 / max(0.01, 0.04 * 49152 / 147456))
    assert out["echo"]["k_to_remove_input_stall"] == 4
    assert out["echo"]["predicted_step_s"]["2"] == pytest.approx(0.02)
    enough = what_ifs(batch_size=10, cores=2, ideal_step_s=0.01, prep_points=[(1, 600.0), (2, 1200.0)],
                      fetch_step_s=0.0, dataset_bytes=1, available_bytes=2, total_bytes=2, paths=[], max_side=8)
    assert enough["cores"]["needed_to_remove_prep_stall"] == 2 and "measured" in enough["cores"]["how"]
    assert enough["page_cache"]["fits"] is True and "note" in enough["max_side"]


def test_check_schema_names_the_place() -> None:
    with pytest.raises(ValueError, match=r"profile.json: missing \['data'"):
        check_schema({"format": "stallfree-profile/1"})
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
    with pytest.raises(ValueError, match=r"x.a\[1\]: expected integer, got str"):
        check_schema({"a": [1, "2"]}, schema, "x")


def test_storage_and_in_memory_reader(tmp_path: Path) -> None:
    paths = _images(tmp_path, [(16, 16)] * 3)
    result = measure_storage(paths, threads=2)
    assert result.files == 3 and result.bytes == sum(p.stat().st_size for p in paths)
    assert result.cold_bytes_per_s > 0 and result.cache_dropped == (result.cold_note is None)

    class Source:
        classes = ["a"]
        encoded, columns = True, ()

        def column(self, name: str, rows: object) -> list:
            raise KeyError(name)

        def __len__(self) -> int:
            return 3

        def labels(self) -> list[int]:
            return [0, 0, 0]

        def read(self, i: int) -> bytes:
            return paths[i].read_bytes()

        def describe(self, i: int) -> str:
            return str(paths[i])

    memory = InMemoryReader(Source(), rows=2)
    assert len(memory) == 2 and memory.read(1).tobytes() == paths[1].read_bytes()
    assert memory.describe(0).endswith("(in memory)")
