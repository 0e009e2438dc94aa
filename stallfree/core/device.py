"""The ``--device`` a user names, parsed once where it enters and checked against this machine before any work.

``--device cuda`` on a machine without a GPU once failed deep inside a run (an ``AssertionError`` from torch after
two profile phases; a stage process's traceback with the cause lost in ``stallfree train``). Both commands and
their Python functions call :func:`check_device` first, so the error is one line naming the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["SIMULATE", "check_device", "parse_device"]


SIMULATE = "--accelerator sim:IMG_PER_S to simulate a device of that speed"


def parse_device(device: str | torch.device | None, *, processes: int = 1, what: str = "--device",
                 instead: str = SIMULATE) -> torch.device:
    """``device`` as a ``torch.device``, checked against this machine: ``cpu``, or a CUDA device that it has.

    The one parse of a device a user names: the commands' ``--device`` and the Loader's ``device=`` both come here.

    Args:
        device: ``cpu``, ``cuda`` or ``cuda:N`` (or that ``torch.device``); ``None`` picks ``cuda`` when torch sees
            a GPU, else ``cpu``.
        processes: how many processes on this machine each take one GPU (``cuda`` with ``N`` pipeline ranks
            needs ``N`` GPUs); ``cuda:N`` names one GPU for a single process.
        what: the argument's name, for the message (``--device``, ``device``).
        instead: what else to do without a GPU, for the message (besides a CPU device).

    Raises:
        ValueError: not a device torch knows, not a CPU or CUDA device, or a CUDA device this machine lacks.
    """
    import torch  # here, not at the top: the commands import this floor while building their parsers (--help)

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{what} {str(device)!r} is not a device: use cpu, cuda or cuda:N ({err})") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"{what} {str(device)!r}: stallfree runs on cpu or cuda[:N], not {parsed.type}")
    if parsed.type == "cpu":
        return parsed
    cpu = "--device cpu" if what.startswith("--") else f"{what}='cpu'"
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise ValueError(f"{what} {device}: torch sees no CUDA GPU on this machine (torch {torch.__version__}, "
                         f"{built}); use {cpu}, or {instead}")
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(f"{what} {device}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}")
    if parsed.index is None and processes > count:
        raise ValueError(f"{what} {device} gives each of {processes} processes a GPU but this machine has {count}; "
                         f"use at most {count} processes (--stages x --dp) or {cpu}")
    return parsed


def check_device(device: str | None, *, processes: int = 1, what: str = "--device", instead: str = SIMULATE) -> str:
    """:func:`parse_device`, as the name torch spells it (``"cpu"``, ``"cuda"``, ``"cuda:1"``) for a config."""
    return str(parse_device(device, processes=processes, what=what, instead=instead))
