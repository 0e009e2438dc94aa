"""The one simulated accelerator: a device of ``R`` images/s that holds no CPU (``--accelerator sim:R``).

On a training machine the model runs on accelerators and the host's cores only feed them. On a machine without
one, ``sim:R`` shows that case honestly: where the device would compute, the caller *waits* (``time.sleep``, which
holds neither a core nor the GIL) for as long as a device training ``R`` images per second would take, while
everything else runs for real. Every simulated device of the project is this one: the trainer's pipeline stages
(their share of the device's time: :mod:`stallfree.stage_runtime.stage_times`), the profiler's step (``stallfree
profile --accelerator``), and the consumers of ``bench e2e`` and ``bench remote``.

The string ``"sim:R"`` is parsed once, where it enters (:func:`parse_accelerator`, called by the training job's
configuration and ``profile_dataset``); everything below takes the :class:`SimAccelerator`. This module imports no
torch, so that a configuration can check ``--accelerator`` without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["SimAccelerator", "hold", "parse_accelerator"]


def hold(seconds: float, since: float | None = None) -> None:
    """Wait as a device computing for ``seconds`` would: no core, no GIL.

    With ``since`` (a ``time.perf_counter()`` reading) the wait ends ``seconds`` after it, so what the caller already
    spent since then (a stand-in's own work) counts as part of the device's time.
    """
    left = seconds if since is None else since + seconds - time.perf_counter()
    if left > 0:
        time.sleep(left)


@dataclass(frozen=True)
class SimAccelerator:
    """A device that runs one replica's forward + backward at ``images_per_s``; ``str()`` gives back ``sim:R``.

    For a token model ``R`` is tokens of linear work per second: the trainer charges a micro-batch its documents'
    cost (:class:`~stallfree.core.cost.Cost`, with attention's quadratic term; ``stage_runtime/stage_times.py``).
    """

    images_per_s: float

    def __post_init__(self) -> None:
        if not self.images_per_s > 0:
            raise ValueError(f"accelerator speed must be > 0 images/s, got {self.images_per_s}")

    def __str__(self) -> str:
        return f"sim:{self.images_per_s:g}"

    def seconds(self, images: float) -> float:
        """How long the device takes to train on ``images`` images (or units of work: a token micro-batch's cost)."""
        return images / self.images_per_s

    def step(self, images: int) -> None:
        """Train on ``images`` images: wait the device's time, holding no CPU."""
        hold(self.seconds(images))


def parse_accelerator(value: str | SimAccelerator | None) -> SimAccelerator | None:
    """``"sim:R"`` (R images/s per replica) as a :class:`SimAccelerator`; ``None`` or ``"none"``: the real device.

    The one parser of ``--accelerator``, for the places where the string enters; a :class:`SimAccelerator` is
    returned as it is.

    Raises:
        ValueError: anything else, naming the accepted forms.
    """
    if value is None or isinstance(value, SimAccelerator):
        return value
    if value == "none":
        return None
    kind, _, speed = value.partition(":")
    try:
        rate = float(speed) if kind == "sim" else None
    except ValueError:
        rate = None
    if rate is None:
        raise ValueError(f"--accelerator must be sim:IMAGES_PER_S (e.g. sim:1000) or none, got {value!r}")
    return SimAccelerator(rate)
