"""Which rank of how many this process is, asked when a Loader's pass starts rather than when it is built.

Lightning's DDP runs the user's script once more for each other rank, and builds its process group only inside
``trainer.fit``; a DataLoader is sharded by the ``DistributedSampler`` Lightning puts in it then. A Loader built at
the top of such a script therefore learns its shard when its pass starts (:meth:`Loader.__iter__`), from, in
order:

1. the ``rank=``/``world_size=`` arguments (each one given wins);
2. ``torch.distributed``'s default group, once it is initialised (Lightning, Accelerate, a hand-written
   ``init_process_group``);
3. the environment: ``RANK`` and ``WORLD_SIZE`` (``torchrun``, torch's ``env://``), or, without ``RANK``,
   ``WORLD_SIZE`` with ``LOCAL_RANK`` and ``NODE_RANK`` (Lightning's launcher sets these in the processes it
   starts; ``GROUP_RANK`` stands for ``NODE_RANK`` as Lightning reads it): rank ``NODE_RANK * LOCAL_WORLD_SIZE +
   LOCAL_RANK``, which needs ``LOCAL_WORLD_SIZE`` only on a node other than 0;
4. else rank 0 of 1.

The default cache folder of a remote source is chosen when the Loader is built, and only has to differ between the
processes of one machine: :func:`cache_rank` takes the best the process knows then (``LOCAL_RANK`` in a process
Lightning started, 0 in the one it starts from).
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["UnknownRank", "cache_rank", "check_shard", "process_shard"]

_HELP = "pass rank= and world_size=, or iterate the Loader after torch.distributed.init_process_group"


class UnknownRank(ValueError):
    """The environment names a node other than 0 but not the ranks per node: known once the process group is."""

    def __init__(self, message: str, local: int):
        super().__init__(message)
        self.local = local


def _env_int(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer (torchrun and Lightning set it to "
                         f"an integer); unset it, or {_HELP}") from None


def _environment() -> tuple[int, int] | None:
    """``(rank, world_size)`` from the environment, ``None`` where it says nothing (see the module docstring).

    Raises:
        ValueError: a variable that is not an integer, or variables that do not make a rank (named).
    """
    rank, world, local = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if world is None:
        if rank is not None:
            raise ValueError(f"environment variable RANK is set but WORLD_SIZE is not; set both (torchrun does), or "
                             f"{_HELP}")
        return None  # LOCAL_RANK alone (Lightning's first process after fit) says nothing of the job
    if world < 1:
        raise ValueError(f"environment variable WORLD_SIZE={world} must be >= 1")
    if rank is None:
        if local is None:
            raise ValueError(f"environment variable WORLD_SIZE is set but RANK is not (nor LOCAL_RANK, as Lightning "
                             f"sets); set RANK (torchrun does), or {_HELP}")
        node, per_node = _env_int("NODE_RANK"), _env_int("LOCAL_WORLD_SIZE")
        node = _env_int("GROUP_RANK") if node is None else node
        if node and per_node is None:
            raise UnknownRank(f"environment variables NODE_RANK={node} and LOCAL_RANK={local} without RANK or "
                             f"LOCAL_WORLD_SIZE do not say this process's rank; set RANK, or {_HELP}", local)
        rank = (node or 0) * (per_node or 0) + local
        if not 0 <= rank < world:
            raise ValueError(f"environment variables NODE_RANK={node or 0}, LOCAL_WORLD_SIZE={per_node} and "
                             f"LOCAL_RANK={local} make rank {rank}, not in [0, WORLD_SIZE={world})")
    if not 0 <= rank < world:
        raise ValueError(f"environment variable RANK={rank} is not in [0, WORLD_SIZE={world})")
    return rank, world


def check_shard(rank: int | None, world_size: int | None) -> None:
    """The ``rank=``/``world_size=`` arguments, checked when the Loader is built.

    Raises:
        ValueError: one is not an int or ``None``, or they are out of range (named).
    """
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool)):
            raise ValueError(f"{name} must be an int or None, got {value!r}")
    if world_size is not None and world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size}")
    if rank is not None and (rank < 0 or (world_size is not None and rank >= world_size)):
        raise ValueError(f"rank must be an int in [0, world_size), got rank={rank}, world_size={world_size}")


def process_shard(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's ``(rank, world_size)`` now: the arguments, else torch.distributed's group, else the environment.

    Raises:
        ValueError: a bad argument or environment variable, or an argument that does not fit the other value
            (named).
    """
    check_shard(rank, world_size)
    if rank is None or world_size is None:
        import torch.distributed as dist

        found = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (
            _environment())
        if found is not None:
            rank = found[0] if rank is None else rank
            world_size = found[1] if world_size is None else world_size
    rank, world_size = (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size), got rank={rank}, world_size={world_size}")
    return rank, world_size


def cache_rank(rank: int | None, world_size: int | None) -> int:
    """The rank that names a remote source's default cache folder, known when the Loader is built (module docstring).

    It checks the arguments and the environment as :func:`process_shard` does, so that a bad value is refused when
    the Loader is built; a rank known only once the process group is gives ``LOCAL_RANK``.

    Raises:
        ValueError: a bad argument or environment variable (named).
    """
    try:
        found = process_shard(rank, world_size)[0]
    except UnknownRank as unknown:
        found = unknown.local
    return found if rank is None else int(rank)
