"""What a Loader state may say, checked when it loads: every field's type and range, and how the fields agree.

A state is read from a checkpoint, which may be damaged, cut short or forged; whatever is wrong with it is a
``ValueError`` naming the field and its value at ``load_state_dict``, never a ``KeyError`` there or a strange epoch
later (``batches=-2`` used to give 12 batches with 8 repeats, ``batches=10**6`` an empty epoch). The cursor
``(position, repeat, batches)`` is the one :class:`~stallfree.pipeline.passes.Pass` keeps: after ``batches``
deliveries, ``repeat`` of them repeats of batch ``number = (batches - repeat) // echo`` (``echo`` in batch mode,
else 1), the rank's stream stands at the start of batch ``number``. Every stream position before it was delivered
once or passed over as skipped (a skipped sample's position, and each later position of it after the stream wraps
round), so the position follows from the batches and the skipped list; a state whose position does not is refused.

**Another rank's state.** A state is a position in the job's one global order, and it names the rank it was taken
on (``rank``; before issue 44 in its fingerprint). At a batch boundary of synchronous training every rank has
delivered the same batches, so a rank that loads another rank's state of the same world size (Lightning
checkpoints rank 0's Loader and loads it on every rank) stands after its own ``batches`` delivered: bit-identical
to its own uninterrupted run. Skipped samples (``on_error="skip"``) are each rank's own, and the state lists only
those of the rank it was taken on: the loading rank starts with none listed and stands where its batches put a rank
that skipped none. Had it skipped samples in that epoch before the state, the samples that filled their places
are delivered again after the resume, as many as it skipped (a warning says so with ``on_error="skip"``); a job
that needs an exact resume with skips saves and loads each rank's own state.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.core.resume import check_fingerprint, state_int, state_mapping
from stallfree.pipeline.elastic import ORDER_FIELDS, elastic_split
from stallfree.pipeline.sampler import Sampler

__all__ = ["LoaderState", "read_state"]

_OWNER = "Loader"
# What each entry of ``skipped`` holds (``EpochRun.skip`` writes them): ints but for the two strings.
_SKIPPED_FIELDS = ("index", "source", "reason", "epoch", "position")


@dataclass(frozen=True)
class LoaderState:
    """A checked state: where the next pass starts.

    ``start`` is ``(position, repeat, batches delivered)``; ``split`` the global position the epoch's split over
    ranks starts at; ``skipped`` this epoch's skipped samples so far; ``rank`` the rank the state was taken on.
    """

    epoch: int
    split: int
    start: tuple[int, int, int]
    skipped: list[dict[str, Any]]
    rank: int


def read_state(state: object, *, version: int, fingerprint: Mapping[str, Any], sampler: Sampler, batch_size: int,
               echo: int, batches: Callable[[int], int], on_error: str = "raise") -> LoaderState:
    """Check ``state`` against the Loader it is loaded into.

    Args:
        state: what ``load_state_dict`` was given.
        version: the state version this Loader writes.
        fingerprint: this Loader's fingerprint.
        sampler: this Loader's sampler (rows, ranks, ``drop_last``).
        batch_size: this Loader's batch size.
        echo: how many times each batch is delivered (``echo`` in batch mode, else 1).
        batches: the batches of a pass over a given number of samples per rank.
        on_error: this Loader's; with ``"skip"``, another rank's state warns (see the module docstring).

    Raises:
        ValueError: naming the field and its value: another version or fingerprint, a field missing, of another
            type or out of range, or fields that disagree (see the module docstring); or a state from another
            world size that cannot be continued on this one (:func:`~stallfree.pipeline.elastic.elastic_split`).
    """
    state = state_mapping(_OWNER, state)
    theirs = state.get("version")
    if isinstance(theirs, bool) or not isinstance(theirs, int) or theirs != version:
        raise ValueError(f"unknown Loader state version {theirs!r} (expected {version}; a state from an older "
                         "stallfree cannot be checked, so start the epoch again)")
    mine = dict(fingerprint)
    their_print = state.get("fingerprint")
    elastic = isinstance(their_print, Mapping) and their_print.get("world_size") != mine["world_size"]
    check_fingerprint(_OWNER, their_print, {k: v for k, v in mine.items() if not (elastic and k in ORDER_FIELDS)})
    world = None  # the state's world size, where it is not this Loader's
    if elastic and isinstance(their_print, Mapping):
        world = state_int(_OWNER, their_print, "world_size", low=1, name="fingerprint.world_size")
    theirs_rank = _rank(state, their_print, sampler.world_size if world is None else world)
    epoch = state_int(_OWNER, state, "epoch")
    split = state_int(_OWNER, state, "split", high=sampler.num_virtual,
                      why=f" (the global positions of an epoch of {sampler.num_virtual} samples)")
    per_rank = sampler.length(split, world)
    start = _cursor(state, per_rank, batch_size, echo, batches(per_rank))
    skipped = _skipped(state, epoch, start[0], per_rank, sampler.num_rows)
    _check_position(start, skipped, per_rank, batch_size, echo)
    if elastic:  # this rank's share of what the old ranks left, from its start
        split = min(elastic_split(state, sampler.world_size), sampler.num_virtual)
        return LoaderState(epoch, split, (0, 0, 0), [], theirs_rank)
    if theirs_rank != sampler.rank:  # after the same batches as the rank it was taken on, none skipped (listed)
        if on_error == "skip":
            warnings.warn(f"rank {sampler.rank} resumes from rank {theirs_rank}'s Loader state: with on_error='skip' "
                          "each rank skips its own samples and this rank's are not in that state, so if it skipped "
                          "any in this epoch before the state, as many of its samples from before it are delivered "
                          "again; load each rank's own state_dict() for an exact resume", UserWarning, stacklevel=4)
        own = _delivered(start, per_rank, batch_size, echo)
        return LoaderState(epoch, split, (own, start[1], start[2]), [], theirs_rank)
    return LoaderState(epoch, split, start, skipped, theirs_rank)


def _rank(state: Mapping[str, Any], fingerprint: Any, world_size: int) -> int:
    """The rank the state was taken on: its ``rank``, or (a state from before issue 44) its fingerprint's."""
    if "rank" in state or not isinstance(fingerprint, Mapping) or "rank" not in fingerprint:
        return state_int(_OWNER, state, "rank", high=world_size - 1, why=f" (a rank of world_size={world_size})")
    return state_int(_OWNER, fingerprint, "rank", high=world_size - 1, name="fingerprint.rank",
                     why=f" (a rank of world_size={world_size})")


def _delivered(start: tuple[int, int, int], per_rank: int, batch_size: int, echo: int) -> int:
    """Samples the batches of ``start`` (position, repeat, batches) delivered, at most the rank's epoch."""
    _, repeat, delivered = start
    return min((delivered - repeat) // echo * batch_size, per_rank)


def _cursor(state: Mapping[str, Any], per_rank: int, batch_size: int, echo: int, total: int) -> tuple[int, int, int]:
    """``(position, repeat, batches)``, each of the right type and range; position is checked with the skipped."""
    delivered = state_int(_OWNER, state, "batches", high=total * echo,
                          why=f" (an epoch of {per_rank} samples per rank in batches of {batch_size}"
                              + (f", each delivered echo={echo} times)" if echo > 1 else ")"))
    repeat = state_int(_OWNER, state, "repeat", high=echo - 1,
                       why=f" (repeats of a batch delivered echo={echo} times, echo_mode='batch')" if echo > 1 else
                       " (each batch is delivered once: echo_mode='batch' with echo > 1 repeats it)")
    if (delivered - repeat) % echo:
        raise ValueError(f"Loader state has repeat={repeat} but batches={delivered}: each batch is delivered "
                         f"echo={echo} times, so batches - repeat is a multiple of {echo}")
    return state_int(_OWNER, state, "position"), repeat, delivered


def _skipped(state: Mapping[str, Any], epoch: int, position: int, per_rank: int, rows: int) -> list[dict[str, Any]]:
    """The skipped entries: each with its fields of their types, of this epoch, before ``position``, once."""
    if "skipped" not in state:
        raise ValueError("Loader state has no 'skipped' field (it was cut short, or is not a Loader state)")
    entries = state["skipped"]
    if not isinstance(entries, list):
        raise ValueError(f"Loader state has skipped={entries!r}: expected a list of skipped samples")
    seen: set[int] = set()
    for i, entry in enumerate(entries):
        name = f"skipped[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"Loader state has {name}={entry!r}: expected a dict with keys {list(_SKIPPED_FIELDS)}")
        if set(entry) != set(_SKIPPED_FIELDS):
            raise ValueError(f"Loader state has {name} with keys {sorted(entry)}: expected {list(_SKIPPED_FIELDS)}")
        for key in ("source", "reason"):
            if not isinstance(entry[key], str):
                raise ValueError(f"Loader state has {name}[{key!r}]={entry[key]!r}: expected a str")
        state_int(_OWNER, entry, "index", high=rows - 1, name=f"{name}[{'index'!r}]",
                  why=f" (a row of the {rows} in the source)")
        if state_int(_OWNER, entry, "epoch", name=f"{name}[{'epoch'!r}]") != epoch:
            raise ValueError(f"Loader state has {name}['epoch']={entry['epoch']} but epoch={epoch}: it lists the "
                             "samples skipped in its own epoch only")
        at = state_int(_OWNER, entry, "position", high=position - 1, name=f"{name}[{'position'!r}]",
                       why=f" (before the state's position {position})")
        if at % max(per_rank, 1) in seen:
            raise ValueError(f"Loader state has {name}['position']={at} twice: a skipped sample is listed once")
        seen.add(at % max(per_rank, 1))
    return [dict(entry) for entry in entries]


def _check_position(start: tuple[int, int, int], skipped: list[dict[str, Any]], per_rank: int, batch_size: int,
                    echo: int) -> None:
    """Refuse a position other than the one the batches delivered and the positions passed over lead to."""
    position, repeat, delivered = start
    samples = _delivered(start, per_rank, batch_size, echo)
    expected = _stream_position(samples, np.array([s["position"] for s in skipped], np.int64), per_rank)
    if position != expected:
        skips = f" and its {len(skipped)} skipped sample(s)" if skipped else " with no skipped samples"
        raise ValueError(f"Loader state has position={position} but batches={delivered} (repeat={repeat}) of "
                         f"{samples} samples{skips} stand at position {expected}")


def _stream_position(samples: int, skipped: np.ndarray, per_rank: int) -> int:
    """The least stream position with ``samples`` positions before it that are not passed over as skipped.

    A skipped position ``b`` is passed over at ``b``, ``b + per_rank``, ``b + 2 * per_rank``, ... (the stream
    wraps round); the count of delivered positions before ``p`` only grows with ``p``, so it is searched for.
    """
    if not len(skipped) or samples == 0:
        return samples
    bad = np.unique(skipped % per_rank)
    if len(bad) >= per_rank:
        raise ValueError(f"Loader state lists every one of the rank's {per_rank} samples as skipped, yet delivered "
                         f"{samples}")

    def delivered(p: int) -> int:
        return p - int(np.maximum(0, -((bad - p) // per_rank)).sum())  # each b: ceil((p - b) / per_rank) if p > b

    low, high = samples, samples
    while delivered(high) < samples:  # at least one good position each wrap (an epoch all skipped is an error)
        high = 2 * high + per_rank
    while low < high:
        middle = (low + high) // 2
        if delivered(middle) < samples:
            low = middle + 1
        else:
            high = middle
    return low
