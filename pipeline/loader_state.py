"""What a Loader state may say, checked when it loads: every field's type and range, and how the fields agree.

A state is read from a checkpoint, which may be damaged, cut short or forged; whatever is wrong with it is a
``ValueError`` naming the field and its value at ``load_state_dict``, never a ``KeyError`` there or a strange epoch
later (``batches=-2`` used to give 12 batches with 8 repeats, ``batches=10**6`` an empty epoch).

A state nests its stages' parts, each read by its own stage::

    {"version": 4, "epoch": 3, "rank": 0, "fingerprint": {...},   the Loader: which epoch, taken where, of what
     "sampler": {"split": 0},                                      the order: where the epoch's split starts
     "batcher": {"position": 96, "repeat": 0, "batches": 3},      the batcher's cursor (:mod:`.batcher`)
     "skipped": [...], "rejected": [...]}                          the skip policy's records (:mod:`.skips`)

The batcher's cursor ``(position, repeat, batches)`` is the one :class:`~stallfree.pipeline.passes.Pass` keeps:
after ``batches`` deliveries, ``repeat`` of them repeats of batch ``number = (batches - repeat) // echo`` (``echo``
in batch mode, else 1), the rank's stream stands at the start of batch ``number``. Every stream position before it
was delivered once or passed over as skipped (a skipped sample's position, and each later position of it after the
stream wraps round), so the position follows from the batches and the skipped list; a state whose position does
not is refused.

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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.core.resume import check_fingerprint, state_int, state_mapping
from stallfree.pipeline.batcher import Batcher, Cursor
from stallfree.pipeline.elastic import ORDER_FIELDS, elastic_split
from stallfree.pipeline.sampler import Order

__all__ = ["LoaderState", "read_state"]

_OWNER = "Loader"
# What each entry of ``skipped`` holds (``EpochRun.skip`` writes them): ints but for the two strings.
_SKIPPED_FIELDS = ("index", "source", "reason", "epoch", "position")
#: A skipped image-text document (:mod:`.image_text_run`) says so: its pack was delivered, without it, so its position
#: was not passed over.
_DOCUMENT = "document"


@dataclass(frozen=True)
class LoaderState:
    """A checked state: where the next pass starts.

    ``start`` is the batcher's cursor; ``split`` the global position the epoch's split over ranks starts at;
    ``skipped`` this epoch's skipped samples so far; ``rank`` the rank the state was taken on.
    """

    epoch: int
    split: int
    start: Cursor
    skipped: list[dict[str, Any]]
    rank: int
    planned_world: int | None = None  # the world size a balanced epoch's packs were planned for, where not this one


def read_state(state: object, *, version: int, fingerprint: Mapping[str, Any], sampler: Order, batcher: Batcher,
               on_error: str = "raise") -> LoaderState:
    """Check ``state`` against the Loader it is loaded into.

    Args:
        state: what ``load_state_dict`` was given.
        version: the state version this Loader writes.
        fingerprint: this Loader's fingerprint.
        sampler: this Loader's sampler (rows, ranks, ``drop_last``).
        batcher: this Loader's batcher (what a batch is; it reads its own cursor).
        on_error: this Loader's; with ``"skip"``, another rank's state warns (see the module docstring).

    Raises:
        ValueError: naming the field and its value: another version or fingerprint, a field missing, of another
            type or out of range, or fields that disagree (see the module docstring); or a state from another
            world size that cannot be continued on this one (:func:`~stallfree.pipeline.elastic.elastic_split`).
    """
    state = _migrated(state_mapping(_OWNER, state), version)
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
    theirs_rank = state_int(_OWNER, state, "rank", high=(world or sampler.world_size) - 1,
                            why=f" (a rank of world_size={world or sampler.world_size})")
    epoch = state_int(_OWNER, state, "epoch")
    planned = _planned_world(_part(state, "sampler")) or world  # a balance's packs: planned for the state's ranks
    sampler = sampler.planned_for(planned)
    total = sampler.total(epoch)
    split = state_int(_OWNER, _part(state, "sampler"), "split", high=total, name="sampler.split",
                      why=f" (the global positions of an epoch of {total} samples)")
    per_rank = sampler.length(split, world, epoch)
    start = batcher.load_cursor(_part(state, "batcher"), per_rank)
    skipped = _skipped(state, epoch, start.position, per_rank, sampler.num_rows)
    _rejected(state)
    _check_position(batcher, start, skipped, per_rank)
    if elastic:  # this rank's share of what the old ranks left, from its start
        split = min(elastic_split(state, sampler.world_size), total)
        return LoaderState(epoch, split, Cursor(), [], theirs_rank, planned)
    if theirs_rank != sampler.rank:  # after the same batches as the rank it was taken on, none skipped (listed)
        if on_error == "skip":
            warnings.warn(f"rank {sampler.rank} resumes from rank {theirs_rank}'s Loader state: with on_error='skip' "
                          "each rank skips its own samples and this rank's are not in that state, so if it skipped "
                          "any in this epoch before the state, as many of its samples from before it are delivered "
                          "again; load each rank's own state_dict() for an exact resume", UserWarning, stacklevel=4)
        own = batcher.samples_before(start, per_rank)
        return LoaderState(epoch, split, Cursor(own, start.repeat, start.delivered), [], theirs_rank, planned)
    return LoaderState(epoch, split, start, skipped, theirs_rank, planned)


def _migrated(state: Mapping[str, Any], version: int) -> Mapping[str, Any]:
    """A version 3 state (flat: its cursor and split at the top, the rank in its fingerprint) as version 4 nests it.

    Checkpoints written before the stages nested their parts (issue 45) load as they did; what is wrong with one is
    named as the version 4 field it became.
    """
    if state.get("version") != 3 or version != 4:
        return state
    out = {key: value for key, value in state.items() if key not in ("position", "repeat", "batches", "split")}
    out["version"] = 4
    out["batcher"] = {key: state[key] for key in ("position", "repeat", "batches") if key in state}
    if "split" in state:
        out["sampler"] = {"split": state["split"]}
    fingerprint = state.get("fingerprint")
    if isinstance(fingerprint, Mapping) and "rank" in fingerprint:
        out["fingerprint"] = {key: value for key, value in fingerprint.items() if key != "rank"}
        out.setdefault("rank", fingerprint["rank"])
    out.setdefault("rejected", [])
    return out


def _part(state: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The nested part ``name`` of a state (a stage's own fields), once it is a dict."""
    if name not in state:
        raise ValueError(f"Loader state has no {name!r} field (it was cut short, or is not a Loader state)")
    part = state[name]
    if not isinstance(part, Mapping):
        raise ValueError(f"Loader state has {name}={part!r}: expected a dict (its {name}'s own fields)")
    return part


def _planned_world(part: Mapping[str, Any]) -> int | None:
    """``sampler.planned_world``: the ranks a balanced epoch was planned for, where not the Loader's (else absent)."""
    if part.get("planned_world") is None:
        return None
    return state_int(_OWNER, part, "planned_world", low=1, name="sampler.planned_world")


def _rejected(state: Mapping[str, Any]) -> None:
    """``rejected``: what the reader left out of the source (a list of records with a path and a reason)."""
    entries = state.get("rejected")
    ok = isinstance(entries, list) and all(isinstance(e, Mapping) and isinstance(e.get("path"), str)
                                           and isinstance(e.get("reason"), str) for e in entries)
    if not ok:
        raise ValueError(f"Loader state has rejected={entries!r}: expected a list of {{'path', 'reason'}} records "
                         "(what the reader left out of the source)")


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
        if set(entry) - {_DOCUMENT} != set(_SKIPPED_FIELDS) or entry.get(_DOCUMENT, True) is not True:
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
        if entry.get(_DOCUMENT):  # a document left out of a delivered pack: several may share its position
            continue
        if at % max(per_rank, 1) in seen:
            raise ValueError(f"Loader state has {name}['position']={at} twice: a skipped sample is listed once")
        seen.add(at % max(per_rank, 1))
    return [dict(entry) for entry in entries]


def _check_position(batcher: Batcher, start: Cursor, skipped: list[dict[str, Any]], per_rank: int) -> None:
    """Refuse a position other than the one the batches delivered and the positions passed over lead to."""
    samples = batcher.samples_before(start, per_rank)
    passed = [s["position"] for s in skipped if not s.get(_DOCUMENT)]  # positions passed over, not delivered
    expected = _stream_position(samples, np.array(passed, np.int64), per_rank)
    if start.position != expected:
        skips = f" and its {len(skipped)} skipped sample(s)" if skipped else " with no skipped samples"
        raise ValueError(f"Loader state has batcher.position={start.position} but batcher.batches={start.delivered} "
                         f"(repeat={start.repeat}) of {samples} samples{skips} stand at position {expected}")


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
