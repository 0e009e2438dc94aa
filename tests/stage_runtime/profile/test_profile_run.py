"""stallfree.profile_dataset: the five-phase run as a library call, with a what-if verified on a resized copy."""

from __future__ import annotations

from pathlib import Path

import pytest

import stallfree
from stallfree.stage_runtime.profile.schema import check_schema


def test_profile_dataset_returns_the_result_and_prints_nothing(image_folder: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    profiled = stallfree.profile_dataset(image_folder, batch_size=4, image_size=32, batches=2, threads=1,
                                         torch_threads=1, device="cpu", max_side=24, verify="max-side",
                                         progress=False)
    assert capsys.readouterr().out == ""  # library code prints nothing to stdout
    result = profiled.to_dict()
    check_schema(result)
    assert result["data"] == str(image_folder) and result["batch_size"] == 4
    # 24 is below the 32-px crop: reported with a warning, never suggested, but verifiable when asked by name.
    m = result["what_if"]["max_side"]
    assert not m["suggested"] and "below the 32-px crop" in m["warning"]
    assert result["what_if"]["top"] is None or result["what_if"]["top"]["what_if"] != "max_side"
    v = result["verify"]
    assert v["what_if"] == "max_side" and v["setting"] == {"max_side": 24}
    assert v["predicted_step_s"] == pytest.approx(m["predicted_step_s"]) and v["run"]["batches"] == 2
    assert profiled.headline in profiled.table() and "verify max_side (max_side=24)" in profiled.table()
    written = profiled.save(tmp_path / "out")
    assert [p.name for p in written] == ["profile.json", "trace.json", "profile.png"] and all(map(Path.exists, written))


@pytest.mark.parametrize(("kwargs", "match"), [({"batches": 0}, "batches must be >= 1, got 0"),
                                               ({"threads": 0}, "threads must be >= 1, got 0"),
                                               ({"verify": "fast"}, "verify must be one of top, echo"),
                                               ({"batch_size": 16}, "needs at least 48 .3 batches of 16."),
                                               ({"model": "gpt_tiny"}, "--model gpt_tiny is a token model")])
def test_bad_arguments_are_named(image_folder: Path, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        stallfree.profile_dataset(image_folder, progress=False, **kwargs)  # type: ignore[arg-type]


def test_a_simulated_accelerator_is_the_step(image_folder: Path) -> None:
    profiled = stallfree.profile_dataset(image_folder, batch_size=4, image_size=16, batches=2, threads=1,
                                         accelerator="sim:200", progress=False).to_dict()
    compute, device = profiled["phases"]["compute"], profiled["accelerator"]
    assert compute["images_per_s"] == 200 and compute["step_s"] == pytest.approx(4 / 200)
    assert device["name"] == "sim:200" and 0.0 <= device["measured_stall"] <= 1.0
    assert device["predicted_stall"] == max(0.0, 1 - device["loader_images_per_s"] / 200)
    # the real run's step is the device's wait: it cannot be shorter
    assert profiled["phases"]["real_run"]["step_s"]["mean"] >= 4 / 200
    from stallfree.stage_runtime.profile.text import report

    lines = report(profiled)
    assert "3 compute (simulated)" in lines and "with a device of 200 img/s, this loader stalls" in lines
    assert "the input pipeline slowed the step by" in lines


def test_a_malformed_accelerator_is_refused_before_any_work(image_folder: Path) -> None:
    with pytest.raises(ValueError, match="--accelerator must be sim:IMAGES_PER_S"):
        stallfree.profile_dataset(image_folder, accelerator="gpu", progress=False)
