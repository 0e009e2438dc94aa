"""Checkpoints: one file per pipeline rank plus a JSON manifest, each written atomically.

Layout (``step`` zero-padded so names sort)::

    ckpt/step-00000040/rank-0.pt     stage weights, optimizer, RNG states and the feed's state of rank 0 (...)
    ckpt/step-00000040/meta.json     step, epoch, balance, world size, schedule
    ckpt/latest.json                 {"step": 40, "dir": "step-00000040"}; written last, after every rank's file

Every file is written by the one atomic write (``stallfree.core.atomic``: temporary name, fsync, rename), and
``latest.json`` moves only after all ranks wrote theirs, so a job killed mid-save leaves the previous
checkpoint intact and complete. Files are loaded with ``weights_only=True``: nothing arbitrary is unpickled.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from stallfree.core.atomic import atomic_path, atomic_write

__all__ = ["latest", "load_meta", "load_rank", "prune", "save_meta", "save_rank", "step_dir"]


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` optimizer steps."""
    return Path(root) / f"step-{step:08d}"


def save_rank(root: str | os.PathLike[str], step: int, rank: int, state: dict[str, Any]) -> Path:
    """Save one pipeline rank's state (tensors, numbers, strings, nested dicts/lists) atomically."""
    path = step_dir(root, step) / f"rank-{rank}.pt"
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def save_meta(root: str | os.PathLike[str], step: int, meta: dict[str, Any]) -> None:
    """Write ``meta.json``, then point ``latest.json`` at this step (call after every rank saved)."""
    folder = step_dir(root, step)
    atomic_write(folder / "meta.json", json.dumps(meta, indent=1, sort_keys=True).encode())
    atomic_write(Path(root) / "latest.json", json.dumps({"step": step, "dir": folder.name}).encode())


def latest(root: str | os.PathLike[str]) -> int | None:
    """The step of the newest complete checkpoint under ``root``, or ``None``."""
    pointer = Path(root) / "latest.json"
    if not pointer.is_file():
        return None
    return int(json.loads(pointer.read_text())["step"])


def load_meta(root: str | os.PathLike[str], step: int) -> dict[str, Any]:
    """The manifest of the checkpoint at ``step``.

    Raises:
        FileNotFoundError: no such checkpoint.
    """
    path = step_dir(root, step) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint manifest {path}; is --resume pointing at a checkpoint folder?")
    return json.loads(path.read_text())


def load_rank(root: str | os.PathLike[str], step: int, rank: int) -> dict[str, Any]:
    """One pipeline rank's saved state (loaded on CPU, tensors only: ``weights_only=True``).

    Raises:
        FileNotFoundError: the checkpoint has no file for this rank (saved with another pipeline layout?).
    """
    path = step_dir(root, step) / f"rank-{rank}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path.parent} has no {path.name}; resume with the same --stages, "
                                "--schedule and --dp it was saved with")
    return torch.load(path, map_location="cpu", weights_only=True)


def prune(root: str | os.PathLike[str], keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (never the one ``latest.json`` names)."""
    current = latest(root)
    folders = sorted(p for p in Path(root).glob("step-*") if p.is_dir())
    for folder in folders[:-keep] if keep > 0 else []:
        if current is None or folder.name != step_dir(root, current).name:
            shutil.rmtree(folder, ignore_errors=True)
