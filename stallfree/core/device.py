"""The ``--device`` a user names, parsed once where it enters and checked against this machine before any work.

``--device cuda`` on a machine without a GPU once failed deep inside a run (an ``AssertionError`` from torch after
two profile phases; a stage process's traceback with the cause lost in ``stallfree train``). Both commands and
their Python functions call :func:`check_device` first, so the error is one line naming the fix.
"""

from __future__ import annotations

__all__ = ["SIMULATE", "check_device"]


SIMULATE = "--accelerator sim:IMG_PER_S to simulate a device of that speed"


def check_device(device: str | None, *, processes: int = 1, what: str = "--device", instead: str = SIMULATE) -> str:
    """``device`` as torch spells it, checked here: ``cpu``, or a CUDA device that this machine has.

    Args:
        device: ``cpu``, ``cuda`` or ``cuda:N``; ``None`` picks ``cuda`` when torch sees a GPU, else ``cpu``.
        processes: how many processes on this machine each take one GPU (``cuda`` with ``N`` pipeline ranks
            needs ``N`` GPUs); ``cuda:N`` names one GPU for a single process.
        what: the argument's name, for the message.
        instead: what else to do without a GPU, for the message (besides ``--device cpu``).

    Returns:
        the device's name (``"cpu"``, ``"cuda"``, ``"cuda:1"``).

    Raises:
        ValueError: not a device torch knows, not a CPU or CUDA device, or a CUDA device this machine lacks.
    """
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{what} {device!r} is not a device: use cpu, cuda or cuda:N ({err})") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"{what} {device!r}: stallfree runs on cpu or cuda[:N], not {parsed.type}")
    if parsed.type == "cpu":
        return str(parsed)
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise ValueError(f"{what} {device}: torch sees no CUDA GPU on this machine (torch {torch.__version__}, "
                         f"{built}); use --device cpu, or {instead}")
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(f"{what} {device}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}")
    if parsed.index is None and processes > count:
        raise ValueError(f"{what} {device} gives each of {processes} processes a GPU but this machine has {count}; "
                         f"use at most {count} processes (--stages x --dp) or --device cpu")
    return str(parsed)
