"""What the simulator charges: per-stage compute times and sizes, links between devices, and their parsing.

Costs come from the partitioner's measurement (:func:`stallfree.stage_runtime.models.partition.measure_layers`, the one
``stallfree train`` balances with, which times the forward, the backward and the backward's weight-gradient part
apart) or from a JSON file a user writes for hardware they do not have::

    {"microbatch": 8,                        # the micro-batch size these figures are for
     "optimizer_s": 0.002,                   # one optimizer step over the whole model (optional, default 0)
     "layers": [{"forward_s": 0.001, "backward_s": 0.002, "weight_s": 0.001,  # weight_s: optional
                 "param_bytes": 1048576, "activation_bytes": 65536}, ...]}

Times and activation sizes scale linearly with the micro-batch size; parameter sizes do not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallfree.stage_runtime.models.layer_times import LayerTimes

__all__ = [
    "DEFAULT_LINK",
    "KINDS",
    "NO_OVERHEAD",
    "Cores",
    "HostOverhead",
    "Link",
    "StageCost",
    "layers_from_json",
    "parse_bytes",
    "parse_link",
    "scale_layers",
    "stage_costs",
]


@dataclass(frozen=True)
class StageCost:
    """One model stage (a run of layers) as the simulator charges it, for one micro-batch."""

    forward_s: float
    backward_s: float  # the full backward: input gradient + weight gradient
    weight_s: float  # the weight-gradient part (run separately by the zero-bubble schedules)
    activation_bytes: int  # held from a micro-batch's forward until its backward is done
    output_bytes: int  # sent to the next stage after a forward (and the same size back after a backward)
    param_bytes: int
    optimizer_s: float  # this stage's share of one optimizer step

    @property
    def input_s(self) -> float:
        """The input-gradient part of the backward."""
        return self.backward_s - self.weight_s


# stallfree plan's link between the devices of a site unless given or calibrated (and a GPU job's prediction's): the
# calibration measures gloo on CPU
DEFAULT_LINK = "25GB/s,5us"
# Link.describe's units, largest first (parse_link reads each: _SIZE_UNITS)
_RATE_UNITS = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB"), (1, "B"))


@dataclass(frozen=True)
class Link:
    """A link between two devices: ``bytes_per_s`` of bandwidth and ``latency_s`` per message."""

    bytes_per_s: float
    latency_s: float

    def busy_s(self, nbytes: int) -> float:
        """How long a message of ``nbytes`` occupies the link (latency does not occupy it)."""
        return nbytes / self.bytes_per_s if self.bytes_per_s != float("inf") else 0.0

    def describe(self) -> str:
        """The link as ``--link`` writes it."""
        if self.bytes_per_s == float("inf"):
            return "free"
        # the largest unit the rate reaches, so that a measured 4.19e15 B/s reads 4.19328PB/s, not 4.19328e+06GB/s;
        # six digits, so that parse_link reads back what was measured
        rate = next(f"{self.bytes_per_s / f:g}{u}/s" for f, u in _RATE_UNITS if self.bytes_per_s >= f or u == "B")
        lat = next(f"{self.latency_s / f:g}{u}" for f, u in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"))
                   if self.latency_s >= f or u == "ns")
        return f"{rate},{lat}"


FREE_LINK = Link(float("inf"), 0.0)


@dataclass(frozen=True)
class Cores:
    """The pipeline's ranks share ``count`` cores (stage processes on one CPU machine), each computing on ``threads``.

    While ``k`` ranks compute at once and ``k x threads`` exceeds ``count``, each computes at ``count / (k x
    threads)`` of its own speed (processor sharing: the cores' time is shared out evenly among the threads that
    want it). Layer costs are measured by one process alone, at full speed.
    """

    count: int
    threads: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or self.threads < 1:
            raise ValueError(f"cores and threads per rank must be >= 1, got {self.count} cores and {self.threads} "
                             "threads per rank")

    def rate(self, computing: int) -> float:
        """The speed of each of ``computing`` ranks computing at once, as a share of its speed alone."""
        return min(1.0, self.count / (computing * self.threads)) if computing else 1.0


KINDS = ("F", "B", "I", "W")  # forward, full backward, input gradient, weight gradient


@dataclass(frozen=True)
class HostOverhead:
    """What torch's schedule runtime costs the host beside the layers' compute, per step, action and message.

    ``action_s`` is added to every forward, backward, input- and weight-gradient action: the Python of
    ``PipelineStage``'s chunk calls (argument handling, shape checks, autograd plumbing), which the trainer's stage
    timing counts as busy. ``kind_s`` replaces it for the kinds it names (``(("I", 9e-4), ("W", 8e-4))``): torch's
    input- and weight-gradient chunks cost more than a forward. ``message_s`` occupies a rank once per message it
    receives, from when it is free to read it (less the wait, if the message arrives later: the receive completes
    as it arrives) and ``send_s`` once per message it sends (after posting it, the message already on its way;
    ``None``: the same as ``message_s``): posting and completing a gloo operation, idle in the trainer's
    bubble. ``gap_s`` idles a rank after each of its actions, before the next (and before its send): the
    runtime's own bookkeeping between two chunk calls. ``wire_s`` delays every message between ranks beyond its
    link's latency: how the schedule posts and waits for its messages (torch's 1F1B waits for the next forward's
    receive together with the last backward's send, which completes only when its own reader posts the receive),
    fitted by the pilots from the messages their readers waited for. ``step_s`` is the schedule step's own set-up
    (splitting the batch into micro-batches, merging the losses), idle on every rank. Measured by
    :func:`~stallfree.stage_runtime.plan.calibrate.calibrate_host`.
    """

    action_s: float = 0.0
    message_s: float = 0.0
    step_s: float = 0.0
    send_s: float | None = None
    kind_s: tuple[tuple[str, float], ...] = ()
    gap_s: float = 0.0
    wire_s: float = 0.0

    def __post_init__(self) -> None:
        values = [self.action_s, self.message_s, self.step_s, self.sender_s, self.gap_s, self.wire_s,
                  *(v for _, v in self.kind_s)]
        if min(values) < 0:
            raise ValueError(f"host overheads must be >= 0 seconds, got action {self.action_s}, message "
                             f"{self.message_s}, step {self.step_s}, send {self.send_s}, gap {self.gap_s}, wire "
                             f"{self.wire_s}, per kind "
                             f"{dict(self.kind_s)}")
        unknown = [k for k, _ in self.kind_s if k not in KINDS]
        if unknown:
            raise ValueError(f"host overhead per action kind: unknown kinds {unknown}; choose from {', '.join(KINDS)}")

    @property
    def sender_s(self) -> float:
        """What a message costs its sender."""
        return self.message_s if self.send_s is None else self.send_s

    def action(self, kind: str) -> float:
        """What one action of ``kind`` (F, B, I or W) costs beside its compute."""
        return dict(self.kind_s).get(kind, self.action_s)

    def actions_only(self) -> HostOverhead:
        """The per-action costs alone (the bubble's causes keep them: they are part of each action)."""
        return HostOverhead(self.action_s, kind_s=self.kind_s, send_s=0.0, gap_s=self.gap_s)

    def to_dict(self) -> dict[str, Any]:
        """As JSON (:meth:`from_dict` reads it back)."""
        return {"action_s": self.action_s, "message_s": self.message_s, "step_s": self.step_s,
                "send_s": self.sender_s, "gap_s": self.gap_s, "wire_s": self.wire_s, "kind_s": dict(self.kind_s)}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> HostOverhead:
        """Read :meth:`to_dict`'s JSON; ``where`` names the file for the error.

        Raises:
            ValueError: not an object of seconds >= 0, or an unknown action kind.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{where}: the host overhead wants an object, got {data!r}")
        kinds = data.get("kind_s", {})
        if not isinstance(kinds, dict):
            raise ValueError(f"{where}: 'kind_s' wants an object of action kind -> seconds, got {kinds!r}")
        send = data.get("send_s")
        return cls(_number(data, "action_s", where, 0.0), _number(data, "message_s", where, 0.0),
                   _number(data, "step_s", where, 0.0), None if send is None else _number(data, "send_s", where),
                   tuple((str(k), _number(kinds, k, f"{where}, kind_s")) for k in sorted(kinds)),
                   _number(data, "gap_s", where, 0.0), _number(data, "wire_s", where, 0.0))


NO_OVERHEAD = HostOverhead()

_SIZE_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15, "kib": 2**10, "mib": 2**20,
               "gib": 2**30, "tib": 2**40, "pib": 2**50, "kbit": 125, "mbit": 125e3, "gbit": 125e6, "tbit": 125e9,
               "pbit": 125e12}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*"


def parse_bytes(text: str, what: str = "--memory-per-device") -> int:
    """``16GiB``, ``512MB``, ``2e9`` -> bytes.

    Raises:
        ValueError: not a number with one of the units B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB.
    """
    match = re.fullmatch(_NUMBER + r"([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS or "bit" in unit:
        raise ValueError(f"{what} wants a size like 16GiB or 512MB, got {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_link(text: str, what: str = "--link") -> Link:
    """``25GB/s,5us`` (bandwidth, latency) -> :class:`Link`; bandwidth in B/s, KB/s ... GiB/s or Gbit/s.

    Raises:
        ValueError: not ``BANDWIDTH/s,LATENCY`` with known units.
    """
    hint = f"{what} wants BANDWIDTH,LATENCY like 25GB/s,5us or 10Gbit/s,20ms, got {text!r}"
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not parts[0].lower().endswith("/s"):
        raise ValueError(hint)
    bw = re.fullmatch(_NUMBER + r"([a-zA-Z]*)", parts[0][:-2])
    lat = re.fullmatch(_NUMBER + r"([a-zµ]*)\s*", parts[1])
    if not bw or not lat or bw.group(2).lower() not in _SIZE_UNITS or lat.group(2) not in _TIME_UNITS:
        raise ValueError(hint)
    rate = float(bw.group(1)) * _SIZE_UNITS[bw.group(2).lower()]
    if rate <= 0:
        raise ValueError(f"{what}: bandwidth must be > 0, got {text!r}")
    return Link(rate, float(lat.group(1)) * _TIME_UNITS[lat.group(2)])


def _number(row: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = row.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where}: {key!r} must be a number >= 0, got {value!r}")
    return float(value)


def layers_from_json(path: str | Path) -> tuple[list[LayerTimes], int, float]:
    """Read a user's cost file (format in this module's docstring): (layers, micro-batch size, optimizer seconds).

    Raises:
        ValueError: unreadable JSON or a missing or negative field; the message names the file and the layer.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"--costs {path}: not JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list) or not data["layers"]:
        raise ValueError(f"--costs {path}: wants an object with a non-empty 'layers' list "
                         "(see docs/plan.md, 'Costs from a file')")
    micro = data.get("microbatch", 1)
    if not isinstance(micro, int) or micro < 1:
        raise ValueError(f"--costs {path}: 'microbatch' must be an integer >= 1, got {micro!r}")
    layers = []
    for i, row in enumerate(data["layers"]):
        where = f"--costs {path}, layer {i}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: wants an object, got {row!r}")
        backward = _number(row, "backward_s", where)
        weight = _number(row, "weight_s", where, backward / 2)
        if weight > backward:
            raise ValueError(f"{where}: weight_s {weight} is part of backward_s {backward} and cannot exceed it")
        layers.append(LayerTimes(_number(row, "forward_s", where), backward, weight,
                                 int(_number(row, "param_bytes", where, 0)),
                                 int(_number(row, "activation_bytes", where))))
    return layers, micro, _number(data, "optimizer_s", f"--costs {path}", 0.0)


def scale_layers(layers: Sequence[LayerTimes], factor: float) -> list[LayerTimes]:
    """The same layers for a micro-batch ``factor`` times larger (times and activations scale, parameters not)."""
    return [LayerTimes(c.forward_s * factor, c.backward_s * factor, c.weight_s * factor, c.param_bytes,
                       int(c.activation_bytes * factor)) for c in layers]


def stage_costs(layers: Sequence[LayerTimes], balance: Sequence[int], optimizer_s: float = 0.0) -> list[StageCost]:
    """Sum each stage's layers; the optimizer step is shared out by parameter bytes.

    Raises:
        ValueError: ``balance`` does not cover the layers with non-empty stages.
    """
    if any(b < 1 for b in balance) or sum(balance) != len(layers):
        raise ValueError(f"balance {list(balance)} must be positive counts summing to {len(layers)} layers")
    total_params = sum(c.param_bytes for c in layers) or 1
    out, start = [], 0
    for b in balance:
        run = layers[start:start + b]
        params = sum(c.param_bytes for c in run)
        out.append(StageCost(sum(c.forward_s for c in run), sum(c.backward_s for c in run),
                             sum(c.weight_s for c in run), sum(c.activation_bytes for c in run),
                             run[-1].activation_bytes, params, optimizer_s * params / total_params))
        start += b
    return out
