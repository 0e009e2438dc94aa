"""The profile's printed report (stage_runtime/profile/text.py) on a real profile's result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import stallfree
from stallfree.stage_runtime.profile.text import report


@pytest.fixture(scope="module")
def profiled(image_folder: Path) -> dict[str, Any]:
    """A real profile's result, the cheapest there is: a simulated device as the step."""
    return stallfree.profile_dataset(image_folder, batch_size=4, image_size=16, batches=2, threads=1,
                                     accelerator="sim:200", progress=False).to_dict()


def _slowdown_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("the input pipeline"))


def test_a_negative_slowdown_is_called_noise_not_a_figure(profiled: dict[str, Any]) -> None:
    # Issue 44, item 6: "the input pipeline slowed the step by -23.0%" (the real run's step was shorter than the
    # step alone: two noisy measurements, not a loader that speeds the step up).
    line = _slowdown_line(report({**profiled, "step_slowdown": -0.23}))
    assert line.startswith("the input pipeline did not measurably slow the step")
    assert "23.0% shorter than the step alone: noise" in line and "-23" not in line


@pytest.mark.parametrize(("slowdown", "shown"), [(0.05, "5.0%"), (0.0, "0.0%")])
def test_a_slowdown_is_its_figure(profiled: dict[str, Any], slowdown: float, shown: str) -> None:
    line = _slowdown_line(report({**profiled, "step_slowdown": slowdown}))
    assert line == (f"the input pipeline slowed the step by {shown} (its mean in the real run against the step "
                    "alone)")
