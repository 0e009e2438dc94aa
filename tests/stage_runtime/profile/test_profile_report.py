"""The differential stalls, the what-ifs and the profile.json schema check, on figures chosen by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from PIL import Image

from stallfree.stage_runtime.profile.chart import title
from stallfree.stage_runtime.profile.phases import InMemoryReader, measure_storage
from stallfree.stage_runtime.profile.report import differential_stalls, headline
from stallfree.stage_runtime.profile.schema import check_schema
from stallfree.stage_runtime.profile.text import verify_line
from stallfree.stage_runtime.profile.verify import chosen
from stallfree.stage_runtime.profile.what_ifs import Observed, what_ifs


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


@example(ideal=1.0, cached=1.0, real=1.0, measured=0.75, fallback=(0.0, 5e-324))  # once 1.0: a subnormal whole
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


def _what_ifs(observed: Observed, prep_points: list[tuple[int, float]], paths: list[Path] | None = None,
              max_side: int = 256, crop_size: int = 32, **kwargs: int) -> dict[str, Any]:
    settings = {"batch_size": 10, "cores": 2, "dataset_bytes": 1, "available_bytes": 2, "total_bytes": 2, **kwargs}
    return what_ifs(observed=observed, prep_points=prep_points, paths=paths or [], max_side=max_side,
                    crop_size=crop_size, **settings)


def test_what_ifs(tmp_path: Path) -> None:
    paths = _images(tmp_path, [(512, 256), (128, 128)])
    seen = Observed(step_s=0.04, compute_s=0.01, read_s=0.04, prep_s=0.02, threads=2)
    out = _what_ifs(seen, [(1, 250.0), (2, 500.0)], paths, dataset_bytes=3 * 2**30, available_bytes=2**30,
                    total_bytes=4 * 2**30)
    assert out["page_cache"]["fits"] is False
    assert out["page_cache"]["more_memory_needed_bytes"] == int(2 * 2**30 * 1.1)
    # (512x256 -> 256x128) and 128x128 unchanged: (32768 + 16384) / (131072 + 16384) of the pixels.
    ratio = 49152 / 147456
    assert out["max_side"]["pixel_ratio"] == pytest.approx(ratio)
    assert out["max_side"]["speedup"] == pytest.approx(0.04 / max(0.01, 0.04 * ratio, 0.02 * ratio))
    assert out["max_side"]["suggested"] and out["max_side"]["warning"] is None
    assert out["echo"]["k_to_remove_input_stall"] == 4
    assert out["echo"]["predicted_step_s"]["2"] == pytest.approx(0.02)
    # max-side predicts 3x, echo=4 4x: max-side comes first, since echo changes what the model sees (issue 35,
    # item 6: "the top suggestion is 'echo=6, batch mode', which changes training, before --max-side").
    assert out["top"] == {"what_if": "max_side", "setting": {"max_side": 256},
                          "predicted_step_s": pytest.approx(0.04 * ratio), "speedup": pytest.approx(1 / ratio),
                          "changes_training": False}
    assert out["observed"]["overhead_s"] == 0


def test_echo_is_predicted_from_the_loaders_observed_read_time() -> None:
    # Regression (issue 10, item 23): echo was predicted from the raw storage rate (a cold read of whole files by
    # 4 threads), not from what the Loader's reads took in the real run; the prediction was 25-75% optimistic.
    seen = Observed(step_s=0.050, compute_s=0.010, read_s=0.045, prep_s=0.005, threads=2)
    echo = _what_ifs(seen, [(1, 2000.0), (2, 4000.0)])["echo"]
    assert echo["k_to_remove_input_stall"] == 5  # ceil(45 / 10)
    # The 5 ms the pipelined model leaves unexplained stays in every prediction.
    assert echo["predicted_step_s"]["2"] == pytest.approx(0.0225 + 0.005)
    assert echo["predicted_step_s"]["5"] == pytest.approx(0.010 + 0.005)
    assert "read 45.0 ms" in echo["assumes"] and "real run's stage clock" in echo["assumes"]


def test_max_side_below_the_crop_is_never_suggested(tmp_path: Path) -> None:
    # Regression (issue 10, item 23): --max-side was suggested below the crop size (every crop upsampled).
    paths = _images(tmp_path, [(512, 384), (400, 300)])
    seen = Observed(step_s=0.04, compute_s=0.01, read_s=0.04, prep_s=0.03, threads=2)
    below = _what_ifs(seen, [(1, 5000.0)], paths, max_side=160, crop_size=224)["max_side"]
    assert below["suggested"] is False and below["speedup"] > 1
    assert below["warning"] == "--max-side 160 is below the 224-px crop: every crop would be upsampled; not suggested"
    near = _what_ifs(seen, [(1, 5000.0)], paths, max_side=256, crop_size=224)["max_side"]
    # 512x384 -> 256x192 and 400x300 -> 256x192: both shorter sides fall below the crop.
    assert near["suggested"] and near["upsampled_share"] == 1.0 and "100% of the images" in near["warning"]


def test_cores_are_not_extrapolated_beyond_the_measured_scaling() -> None:
    # Regression (issue 10, item 23): 500 img/s at 2 threads was extrapolated linearly to "4 cores" for a step
    # eating 1,000 img/s, although nothing beyond 2 threads was measured (and scaling is rarely linear).
    seen = Observed(step_s=0.04, compute_s=0.01, read_s=0.001, prep_s=0.02, threads=2)
    cores = _what_ifs(seen, [(1, 250.0), (2, 500.0)])["cores"]
    assert cores["needed_to_remove_prep_stall"] is None and cores["predicted_step_s"] is None
    assert cores["at_least"] == 4 and "not reached within the measured scaling" in cores["how"]
    assert "not extrapolated" in cores["assumes"]
    enough = _what_ifs(Observed(0.04, 0.01, 0.001, 0.02, threads=1), [(1, 500.0), (2, 1200.0)])
    assert enough["cores"]["needed_to_remove_prep_stall"] == 2 and "measured" in enough["cores"]["how"]
    assert enough["cores"]["predicted_step_s"] == pytest.approx(max(0.01, 0.02 * 500 / 1200) + 0.02)
    assert "note" in enough["max_side"] and not enough["max_side"]["suggested"]


def test_nothing_to_try_when_no_what_if_gains_five_percent() -> None:
    seen = Observed(step_s=0.0101, compute_s=0.010, read_s=0.002, prep_s=0.002, threads=1)
    out = _what_ifs(seen, [(1, 5000.0)])
    assert out["echo"]["k_to_remove_input_stall"] == 1 and out["top"] is None
    assert chosen(out, "top") == "no what-if predicts a gain over 5%: nothing to verify"
    assert chosen(out, "echo") == ("echo", {"echo": 2, "echo_mode": "batch"}, pytest.approx(0.0101))
    assert chosen(out, "cores") == "cannot verify more cores: " + out["cores"]["how"]
    with pytest.raises(ValueError, match="--verify must be top, echo, max-side or cores, got 'x'"):
        chosen(out, "x")
    nothing = {"what_if": None, "note": chosen(out, "top")}
    assert verify_line(nothing) == "verify: no what-if predicts a gain over 5%: nothing to verify"


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
    assert len(memory) == 2 and memory.read(1)["image"].tobytes() == paths[1].read_bytes()
    assert memory.describe(0).endswith("(in memory)")


def test_echo_is_suggested_only_when_nothing_that_leaves_training_as_it_is_helps() -> None:
    # Reads set the pace; one core, already used; no image headers (no --max-side estimate): echo alone helps.
    seen = Observed(step_s=0.04, compute_s=0.01, read_s=0.04, prep_s=0.005, threads=1)
    out = _what_ifs(seen, [(1, 5000.0)], cores=1)
    assert out["top"] == {"what_if": "echo", "setting": {"echo": 4, "echo_mode": "batch"},
                          "predicted_step_s": pytest.approx(0.01), "speedup": pytest.approx(4.0),
                          "changes_training": True}
    assert "sees each batch k times" in out["echo"]["changes_training"]


def test_a_stage_slower_than_the_loop_it_fed_is_capped_at_the_loops_pace_and_said() -> None:
    # Issue 35, item 6: "prepare 721.1 ms per batch" beside a loop that ran far faster: spans that held a finished
    # batch waiting for a full queue. The loop delivered every batch, so no stage took longer per batch than it.
    run = {"wall_s": 1.0, "batches": 10, "step_s": {"mean": 0.097},
           "stage_time_per_batch_s": {"read": 0.01, "augment": 0.7, "h2d": 0.02}}
    seen = Observed.from_run(run, threads=2)
    assert seen.prep_s == pytest.approx(0.1) and seen.read_s == pytest.approx(0.01)
    assert seen.capped == (("prepare", pytest.approx(0.72)),)
    assert "prepare spans add up to 720.0 ms per batch, longer than the loop's 100.0 ms" in seen.notes()[0]
    out = _what_ifs(seen, [(1, 2000.0), (2, 4000.0)])
    assert out["observed"]["notes"] == seen.notes()
    assert out["echo"]["k_to_remove_input_stall"] == 1  # 100 ms against a 97 ms step: within 5%, no stall


def test_the_ray_what_if_counts_the_workers_that_keep_up_with_the_step() -> None:
    # The step takes 10 images in 10 ms (1,000 img/s); preparation measured 300 img/s at 2 threads: 4 workers of
    # 2 cores prepare 1,200 img/s, so the read and preparation leave the process and the step sets the pace.
    seen = Observed(step_s=0.040, compute_s=0.010, read_s=0.030, prep_s=0.035, threads=2)
    ray = _what_ifs(seen, [(1, 160.0), (2, 300.0)])["ray"]
    assert ray["cores_per_worker"] == 2 and ray["workers_needed"] == 4
    assert ray["predicted_step_s"] == pytest.approx(max(0.010, 10 / 1200) + seen.overhead_s)
    assert ray["speedup"] == pytest.approx(0.040 / (0.010 + seen.overhead_s))  # the unexplained 5 ms stays
    assert "RayWorkers(num_workers=4, cpus_per_worker=2)" in ray["how"] and "not measured here" in ray["assumes"]
