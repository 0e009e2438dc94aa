"""A calibration of the simulator on this machine: the link, and each schedule family's host overhead, as JSON.

:mod:`.calibrate` measures one (``stallfree bench plan --json-file`` writes it); ``stallfree plan --calibration``
reads it back (:func:`read_calibration`) and the planner charges its overheads (:mod:`.overhead`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stallfree.stage_runtime.plan.costs import HostOverhead, Link, parse_link
from stallfree.stage_runtime.schedules import SCHEDULE_SPECS

__all__ = ["CALIBRATION_FORMAT", "FAMILIES", "Calibration", "PipelineTimes", "read_calibration"]


class _Families(Mapping[str, str]):
    """Each schedule's family, read from its spec whenever asked: a schedule added to the table has one here."""

    def __getitem__(self, schedule: str) -> str:
        return SCHEDULE_SPECS[schedule].family

    def __iter__(self) -> Iterator[str]:
        return iter(SCHEDULE_SPECS)

    def __len__(self) -> int:
        return len(SCHEDULE_SPECS)

    def __repr__(self) -> str:
        return repr(dict(self))


# torch runs GPipe and 1F1B by a hand-written loop, the others by its action-list runtime: each family has its
# own costs per action, send and step, so each is fitted from its own runs. Schedule name -> ``ScheduleSpec.family``.
FAMILIES: Mapping[str, str] = _Families()


@dataclass(frozen=True)
class PipelineTimes:
    """The near-empty pipeline under one schedule: the median schedule step and every rank's spans."""

    schedule: str
    microbatches: int
    schedule_s: float  # the pipeline's schedule step timed whole after a barrier, as the trainer times it (median)
    records: tuple[dict[str, Any], ...] = field(repr=False)  # per rank, its stage clock's records


@dataclass(frozen=True)
class Calibration:
    """What this machine measured: the link, the runtime's overhead, and the figures they were fitted from."""

    link: Link
    overheads: dict[str, HostOverhead]  # per family of :data:`FAMILIES`
    ranks: int
    layer_s: float  # the near-empty layer's forward + backward, by the partitioner's measurement
    pipeline: tuple[PipelineTimes, ...] = ()
    attribution: tuple[dict[str, Any], ...] = ()  # per run of ``pipeline``: what its spans show

    def overhead(self, schedule: str) -> HostOverhead:
        """The overhead of ``schedule``'s family.

        Raises:
            ValueError: an unknown schedule, or one whose family this calibration did not measure.
        """
        family = FAMILIES.get(schedule)
        if family is None or family not in self.overheads:
            raise ValueError(f"no calibrated host overhead for schedule {schedule!r} (measured: "
                             f"{', '.join(self.overheads)}; families {FAMILIES})")
        return self.overheads[family]

    def to_dict(self) -> dict[str, Any]:
        """As JSON (:func:`read_calibration` reads it back)."""
        return {"format": CALIBRATION_FORMAT, "link": self.link.describe(),
                "overhead": {k: v.to_dict() for k, v in self.overheads.items()},
                "ranks": self.ranks, "layer_s": self.layer_s,
                "pipeline": [{"schedule": p.schedule, "microbatches": p.microbatches, "schedule_s": p.schedule_s,
                              **a} for p, a in zip(self.pipeline, self.attribution, strict=True)]}


CALIBRATION_FORMAT = "stallfree-calibration-2"


def read_calibration(path: str | Path) -> dict[int, Calibration]:
    """The calibrations in ``path``, keyed by their rank count.

    ``path`` holds one :meth:`Calibration.to_dict`, or ``stallfree bench plan``'s JSON (one per stage count,
    under ``calibration``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or neither form; the message names the file and the field.
    """
    path = Path(path)
    where = f"--calibration {path}"
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no such file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not JSON ({err})") from None
    if isinstance(data, dict) and isinstance(data.get("calibration"), dict):
        entries = list(data["calibration"].values())
    else:
        entries = [data]
    out = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("format") != CALIBRATION_FORMAT:
            raise ValueError(f"{where}: wants a calibration ({CALIBRATION_FORMAT!r}, as stallfree bench plan "
                             f"--json-file writes), got {str(entry)[:80]!r}")
        ranks = entry.get("ranks")
        if not isinstance(ranks, int) or ranks < 2:
            raise ValueError(f"{where}: 'ranks' must be an integer >= 2, got {ranks!r}")
        overheads = entry.get("overhead")
        if not isinstance(overheads, dict) or not overheads or any(k not in FAMILIES.values() for k in overheads):
            raise ValueError(f"{where}: 'overhead' wants an object per schedule family "
                             f"({', '.join(sorted(set(FAMILIES.values())))}), got {str(overheads)[:80]!r}")
        out[ranks] = Calibration(parse_link(str(entry.get("link")), f"{where}: 'link'"),
                                 {k: HostOverhead.from_dict(v, f"{where}: 'overhead', {k!r}")
                                  for k, v in overheads.items()}, ranks, float(entry.get("layer_s", 0.0)))
    if not out:
        raise ValueError(f"{where}: holds no calibration")
    return out
