"""Checkpoints: one file per pipeline rank plus a JSON manifest, each written atomically.

Layout (``step`` zero-padded so names sort)::

    ckpt/step-00000040/rank-0.pt     stage weights, optimizer, RNG states and the feed's state of rank 0 (...)
    ckpt/step-00000040/meta.json     step, epoch, balance, world size, schedule, and the job's settings that
                                     shape the files (model, classes, stages, schedule, replicas, optimizer...)
    ckpt/latest.json                 {"step": 40, "dir": "step-00000040"}; written last, after every rank's file

Every file is written by the one atomic write (``stallfree.core.atomic``: temporary name, fsync, rename), and
``latest.json`` moves only after all ranks wrote theirs, so a job killed mid-save leaves the previous
checkpoint intact and complete. Files are loaded with ``weights_only=True``: nothing arbitrary is unpickled.

``--resume`` compares the command with the checkpoint's settings before any file is loaded (:func:`check_job`), so
that another ``--model``, ``--stages`` or ``--schedule`` is named as such, not as the ``state_dict`` or index
error that loading would give.

A write the file system refuses (a full disk, a quota, no permission) raises :class:`CheckpointWriteError` naming
the file, the reason and the previous checkpoint, which it leaves intact. ``torch.save`` writes into an open file
here, not to a path: given a path, a full disk surfaces only as its ``enforce fail at inline_container.cc ...
unexpected pos``; given a file, the ``OSError`` is the context of that error, and is what is reported.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from stallfree.core.atomic import atomic_path, atomic_write
from stallfree.stage_runtime.config.train_config import TrainConfig, flag

__all__ = ["CheckpointWriteError", "check_job", "latest", "load_meta", "load_rank", "manifest", "prune", "save_meta",
           "save_rank", "step_dir"]


class CheckpointWriteError(OSError):
    """A checkpoint file could not be written (``errno`` says why: ``ENOSPC``...); the previous one is intact."""


def step_dir(root: str | os.PathLike[str], step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` optimizer steps."""
    return Path(root) / f"step-{step:08d}"


def save_rank(root: str | os.PathLike[str], step: int, rank: int, state: dict[str, Any]) -> Path:
    """Save one pipeline rank's state (tensors, numbers, strings, nested dicts/lists) atomically."""
    path = step_dir(root, step) / f"rank-{rank}.pt"
    with _writing(root, path), atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state, f)
    return path


def save_meta(root: str | os.PathLike[str], step: int, meta: dict[str, Any]) -> None:
    """Write ``meta.json``, then point ``latest.json`` at this step (call after every rank saved)."""
    folder = step_dir(root, step)
    with _writing(root, folder / "meta.json"):
        atomic_write(folder / "meta.json", json.dumps(meta, indent=1, sort_keys=True).encode())
    with _writing(root, Path(root) / "latest.json"):
        atomic_write(Path(root) / "latest.json", json.dumps({"step": step, "dir": folder.name}).encode())


@contextmanager
def _writing(root: str | os.PathLike[str], path: Path) -> Iterator[None]:
    """Turn the file system's refusal to write ``path`` into a :class:`CheckpointWriteError` that says so."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        cause = _os_error(err)
        if cause is None:
            raise
        previous = latest(root)
        kept = ("no earlier checkpoint is complete" if previous is None else
                f"the previous checkpoint {step_dir(root, previous)} is intact")
        reason = os.strerror(cause.errno).lower() if cause.errno else str(cause)
        failed = CheckpointWriteError(f"{reason} writing checkpoint {path} ({kept})")
        failed.errno = cause.errno
        raise failed from err


def _os_error(err: BaseException) -> OSError | None:
    """The ``OSError`` with an ``errno`` that ``err`` is or was raised from (``torch.save``: its context)."""
    seen: set[int] = set()
    found: BaseException | None = err
    while found is not None and id(found) not in seen:
        if isinstance(found, OSError) and found.errno is not None:
            return found
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return None


def manifest(config: TrainConfig, step: int, epoch: int, balance: Sequence[int], num_classes: int) -> dict[str, Any]:
    """``meta.json`` of ``config``'s job (a ``TrainConfig``) after ``step`` steps.

    It holds the place to continue from (``epoch`` is the next step's), the split, and the settings the rank files
    are shaped by (``job``, which :func:`check_job` reads).
    """
    return {"step": step, "epoch": epoch, "balance": list(balance), "world_size": config.pipeline.world_size,
            "schedule": config.pipeline.schedule, "job": _job(config, num_classes)}


def check_job(root: str | os.PathLike[str], step: int, config: TrainConfig, num_classes: int | None = None) -> None:
    """Refuse to resume ``config`` (a ``TrainConfig``) from the checkpoint at ``step`` if it was saved by another job.

    ``num_classes`` is the job's class count where it is known (``None``: ``config.model.num_classes``, if given).
    A checkpoint of an older stallfree, without ``job``, is compared by its schedule and world size.

    Raises:
        ValueError: naming each setting that differs, the checkpoint's value and the command's.
    """
    meta = load_meta(root, step)
    saved = meta.get("job") or {"schedule": meta.get("schedule"), "world_size": meta.get("world_size")}
    mine = _job(config, num_classes if num_classes is not None else config.model.num_classes)
    mine["world_size"] = config.pipeline.world_size
    if config.pipeline.balance is not None:
        saved, mine = {**saved, "balance": meta.get("balance")}, {**mine, "balance": list(config.pipeline.balance)}
    if saved.get("placement") == mine["placement"]:  # the same stages on the same ranks: another schedule fits
        del mine["schedule"], mine["virtual_stages"]
    elif config.pipeline.spec.stages_fixed is not None:  # a schedule placing its own stages: --virtual-stages unread
        del mine["virtual_stages"]
    del mine["placement"]  # named by what decides it: --stages, --schedule, --virtual-stages
    differ = [k for k in mine if k in saved and saved[k] is not None and mine[k] is not None and saved[k] != mine[k]]
    if differ:
        def shown(job: dict[str, Any]) -> str:
            return ", ".join(f"{_FLAG.get(k) or flag(k)} {_text(job[k])}" for k in differ)

        raise ValueError(f"--resume: the checkpoint {step_dir(root, step)} was saved by a job with {shown(saved)}; "
                         f"this command has {shown(mine)}: resume with the checkpoint's settings, or start a new run "
                         "in another --out (or --checkpoint-dir)")


# check_job's names of what no single flag sets
_FLAG = {"world_size": "processes (--stages x --dp)", "model_kwargs": "model_kwargs"}


def _job(config: TrainConfig, num_classes: int | None) -> dict[str, Any]:
    """The settings of ``config`` that shape a checkpoint's files, as JSON values (tuples are lists)."""
    m, p = config.model, config.pipeline
    job = {"model": m.name, "model_kwargs": m.kwargs, "image_size": m.image_size,
           "num_classes": num_classes, "stages": p.stages, "schedule": p.schedule,
           "virtual_stages": p.virtual_stages, "dp": p.dp, "optimizer": config.optimizer.name,
           # each model stage's pipeline rank: schedules that place the stages alike (gpipe, 1f1b, 2bw) share files
           "placement": [p.owner(s) for s in range(p.model_stages)]}
    return dict(json.loads(json.dumps(job)))


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else json.dumps(value) if isinstance(value, dict) \
        else str(value)


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
