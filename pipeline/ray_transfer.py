"""What crosses the network per batch from a Ray worker, and what the Loader's process does with it.

``transfer="output"``: the Loader's output itself (its dtype and layout): bit-identical to the local Loader; a
224x224x3 float32 image is 602 KB. ``transfer="uint8"``: the worker's graph stops before a trailing ``Normalize``
and the float conversion and sends uint8 NHWC (150 KB for the same image); the Loader's process then scales,
normalizes, transposes and casts with torch, on the batch's device (DESIGN.md: normalize and dtype on the trainer's
device). With ``dtype="uint8"`` both send the same bytes. With a float dtype the uint8 image is the graph's own
rounding of its float values (the CPU graph resizes straight to float where it can), so values may differ from the
local Loader's by up to one uint8 level divided by the std.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.ops.normalize import Normalize

__all__: list[str] = []

Finish = Callable[[torch.Tensor], torch.Tensor]


def worker_spec(compiled: CompiledTransforms, transfer: str) -> tuple[CompiledTransforms, Finish]:
    """The spec the workers run for ``transfer``, and what turns their output into the Loader's.

    Raises:
        ValueError: ``transfer="uint8"`` with a ``Normalize`` that is not the last step (what follows it works on
            floats, so the image cannot travel as uint8 before it).
    """
    if transfer == "output" or compiled.dtype == "uint8":
        return compiled, _as_loader_layout(compiled.layout)
    steps = list(compiled.steps)
    normalize = steps[-1] if steps and isinstance(steps[-1], Normalize) else None
    body = steps[:-1] if normalize is not None else steps
    inner = [i for i, step in enumerate(body) if isinstance(step, Normalize)]
    if inner:
        raise ValueError(f"RayWorkers(transfer='uint8') needs Normalize as the last step, but step {inner[0]} "
                         f"({body[inner[0]]!r}) is followed by others; use transfer='output', or move Normalize last")
    worker = CompiledTransforms(body, dtype="uint8", layout="NHWC", channels=compiled.channels)
    if normalize is not None:
        mean, std = (list(v) * (3 // len(v)) for v in (normalize.mean, normalize.std))
    else:
        mean, std = [0.0] * 3, [1.0] * 3
    channels = compiled.channels
    shift = torch.tensor(mean[:channels], dtype=torch.float32) * 255.0
    scale = torch.tensor(std[:channels], dtype=torch.float32) * 255.0
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(compiled.dtype, torch.float32)
    layout = compiled.layout

    def finish(images: torch.Tensor) -> torch.Tensor:  # (B, H, W, C) uint8 -> the Loader's dtype and layout
        # One converting copy into the output's memory order, then in place: (x - mean) / std, as Normalize.
        order = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        if layout == "NHWC":
            out = images.to(torch.float32)
            view = (1, 1, 1, channels)
        else:
            out = images.permute(0, 3, 1, 2).to(torch.float32, memory_format=order)
            view = (1, channels, 1, 1)
        out.sub_(shift.to(out.device).view(view)).div_(scale.to(out.device).view(view))
        return out if dtype == torch.float32 else out.to(dtype, memory_format=order)

    return worker, finish


def _as_loader_layout(layout: str) -> Finish:
    """``channels_last`` travels as its NHWC memory (ray_take._portable) and is viewed as NCHW again here."""
    if layout != "channels_last":
        return lambda images: images
    return lambda images: images.permute(0, 3, 1, 2)


def received(output: Any) -> torch.Tensor:
    """A worker's array as a tensor of this process's own memory (Ray's zero-copy arrays are read-only)."""
    if isinstance(output, torch.Tensor):
        return output
    return torch.from_numpy(np.array(output, copy=True))


def bytes_of(output: Any) -> int:
    """Bytes a worker's output took over the network."""
    if isinstance(output, torch.Tensor):
        return int(output.numel() * output.element_size())
    return int(np.asarray(output).nbytes)
