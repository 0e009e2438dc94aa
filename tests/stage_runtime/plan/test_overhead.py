"""The one rule for the host overhead a plan is charged: pilots of its rank count, else the nearest calibration."""

from __future__ import annotations

from stallfree.stage_runtime.plan.calibration import Calibration
from stallfree.stage_runtime.plan.costs import NO_OVERHEAD, HostOverhead, Link
from stallfree.stage_runtime.plan.overhead import OverheadChoice
from stallfree.stage_runtime.plan.pilots import PilotFit

LINK = Link(2e9, 1e-4)


def _calibration(ranks: int, step_s: float) -> Calibration:
    return Calibration(LINK, {"loop": HostOverhead(step_s=step_s), "runtime": HostOverhead(step_s=10 * step_s)},
                       ranks, 1e-5)


def test_pilots_first_then_the_nearest_calibration_then_none() -> None:
    own, family = HostOverhead(step_s=1.0), HostOverhead(step_s=2.0)
    fit = PilotFit({"gpipe": own}, {"loop": family})
    choice = OverheadChoice({2: _calibration(2, 1e-3), 4: _calibration(4, 4e-3)}, {2: fit})
    assert choice.choose("gpipe", 2) == (own, "schedule")
    assert choice.choose("1f1b", 2) == (family, "family")  # 1F1B runs in GPipe's family (torch's loop)
    assert choice.choose("zbv", 2) == (HostOverhead(step_s=1e-2), "calibration")  # no pilot of its family
    assert choice.choose("gpipe", 3) == (HostOverhead(step_s=4e-3), "calibration")  # equally near: the larger
    assert choice("gpipe", 5) == HostOverhead(step_s=4e-3)
    assert choice.used == {2: 2, 3: 4, 5: 4}  # what plan.json's calibration "used" says
    assert OverheadChoice().choose("gpipe", 2) == (NO_OVERHEAD, "none")
