"""Which host overhead a prediction charges: the one rule ``stallfree plan`` and ``stallfree bench plan`` follow.

For a schedule at a pipeline rank count, in this order:

1. pilots of that rank count (:class:`~.pilots.PilotFit`): the schedule's own fit, else its family's;
2. a calibration (:class:`~.calibration.Calibration`) of that rank count, else of the nearest (the larger of two
   equally near): torch's runtime costs more with more processes sharing the cores;
3. no overhead (:data:`~.costs.NO_OVERHEAD`): the runtime is free, as for a GPU job without a calibration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .calibration import Calibration
from .costs import NO_OVERHEAD, HostOverhead
from .pilots import PilotFit

__all__ = ["OverheadChoice", "OverheadSource"]

# "schedule" and "family": from pilots (the schedule's own, or its family's); "calibration"; "none": free.
OverheadSource = Literal["schedule", "family", "calibration", "none"]


@dataclass(frozen=True)
class OverheadChoice:
    """``(schedule, pipeline ranks) -> HostOverhead``, as :func:`~.planner.rank_plans` takes it (see above).

    ``calibrations`` and ``fits`` are keyed by the rank count they were measured or fitted at. ``used`` records,
    for every rank count the calibration was consulted for, the rank count of the calibration taken.
    """

    calibrations: Mapping[int, Calibration] = field(default_factory=dict)
    fits: Mapping[int, PilotFit] = field(default_factory=dict)
    used: dict[int, int] = field(default_factory=dict, compare=False)

    def nearest(self, ranks: int) -> int:
        """The rank count of the calibration a plan of ``ranks`` takes: the same, else the nearest."""
        return min(self.calibrations, key=lambda r: (abs(r - ranks), -r))

    def choose(self, schedule: str, ranks: int) -> tuple[HostOverhead, OverheadSource]:
        """The overhead ``schedule`` at ``ranks`` pipeline ranks is charged, and where it came from."""
        fit = self.fits.get(ranks)
        found = fit.overhead(schedule) if fit is not None else None
        if fit is not None and found is not None:
            return found, "schedule" if fit.source(schedule) == "schedule" else "family"
        if not self.calibrations:
            return NO_OVERHEAD, "none"
        self.used[ranks] = self.nearest(ranks)
        return self.calibrations[self.used[ranks]].overhead(schedule), "calibration"

    def __call__(self, schedule: str, ranks: int) -> HostOverhead:
        return self.choose(schedule, ranks)[0]
