"""A forged, damaged or truncated Loader state is refused when it loads, with a ValueError naming the field.

Regression (issue 37, case 11): ``load_state_dict`` checked only the version and the fingerprint, so
``batches=-2`` gave 12 batches with 8 repeats, ``repeat=5`` 14 batches with 48 repeats and ``batches=10**6`` an
empty epoch; truncated or wrong-typed states raised ``KeyError: 'position'``, ``AttributeError`` or ``TypeError``,
some only at iteration. Every state a real run takes must still load.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from stallfree import DatasetReader, Loader
from stallfree.transforms import CenterCrop

N, BATCH = 23, 4  # 6 batches: 5 of 4 and a last one of 3


@pytest.fixture
def make(indexed_reader: Callable[[int], DatasetReader]) -> Callable[..., Loader]:
    reader = indexed_reader(N)
    return lambda **kwargs: Loader(reader, BATCH, transform=[CenterCrop(4)], seed=2, num_threads=1, **kwargs)


def taken(loader: Loader, delivered: int) -> dict[str, Any]:
    """The state after ``delivered`` batches, through JSON as a checkpoint holds it."""
    it = iter(loader)
    for _ in range(delivered):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


# The stage each nested field belongs to: a state nests its stages' parts (pipeline/loader_state.py).
PART = {"position": "batcher", "repeat": "batcher", "batches": "batcher", "split": "sampler"}


def forged(state: dict[str, Any], **fields: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(state))
    for key, value in fields.items():
        (out[PART[key]] if key in PART else out)[key] = value
    return out


def without(state: dict[str, Any], key: str) -> dict[str, Any]:
    out = json.loads(json.dumps(state))
    del (out[PART[key]] if key in PART else out)[key]
    return out


def field(state: dict[str, Any], key: str) -> Any:
    return state[PART[key]][key] if key in PART else state[key]


def named(key: str) -> str:
    """How a message names ``key``: with its part (``batcher.position``)."""
    return f"{PART[key]}.{key}" if key in PART else key


SKIP = {"index": 3, "source": "row 3", "reason": "truncated", "epoch": 0, "position": 3}

# (what is forged, the message it gets), on the state taken after 2 batches: position 8, batches 2.
FORGED: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    # the three
    "batches-negative": (lambda s: forged(s, batches=-2),
                         r"Loader state has batcher\.batches=-2: expected an int in 0\.\.6"),
    "repeat-5": (lambda s: forged(s, repeat=5),
                 r"Loader state has batcher\.repeat=5: expected an int in 0\.\.0 .*echo"),
    "batches-a-million": (lambda s: forged(s, batches=10**6), r"batcher\.batches=1000000: expected an int in 0\.\.6"),
    # truncated
    **{f"no-{key}": ((lambda s, key=key: without(s, key)), rf"Loader state has no {named(key)!r} field")
       for key in ("epoch", "position", "repeat", "batches", "split", "skipped")},
    "no-fingerprint": (lambda s: without(s, "fingerprint"), "Loader state has no fingerprint"),
    "not-a-dict": (lambda s: list(s.items()), "a Loader state must be a dict .* got list"),
    "none": (lambda s: None, "a Loader state must be a dict .* got NoneType"),
    # wrong types
    "version-true": (lambda s: forged(s, version=True), "unknown Loader state version True"),
    "epoch-bool": (lambda s: forged(s, epoch=True), "Loader state has epoch=True: expected an int"),
    "epoch-negative": (lambda s: forged(s, epoch=-1), r"Loader state has epoch=-1: expected an int >= 0"),
    "position-str": (lambda s: forged(s, position="8"), "Loader state has batcher.position='8': expected an int"),
    "batches-float": (lambda s: forged(s, batches=2.0), "Loader state has batcher.batches=2.0: expected an int"),
    "split-none": (lambda s: forged(s, split=None), "Loader state has sampler.split=None: expected an int"),
    "split-past-the-epoch": (lambda s: forged(s, split=24),
                             r"Loader state has sampler\.split=24: expected an int in 0\.\.23"),
    "batcher-not-a-dict": (lambda s: forged(s, batcher=[8, 0, 2]),
                           r"Loader state has batcher=\[8, 0, 2\]: expected a dict"),
    "fingerprint-list": (lambda s: forged(s, fingerprint=[1]), "Loader state has fingerprint=.*expected a dict"),
    "skipped-str": (lambda s: forged(s, skipped="x"), "Loader state has skipped='x': expected a list"),
    # inconsistent
    "position-ahead": (lambda s: forged(s, position=9),
                       r"Loader state has batcher\.position=9 but batcher\.batches=2 .* stand at position 8"),
    "position-behind": (lambda s: forged(s, position=0), "Loader state has batcher.position=0 but batcher.batches=2"),
    "skipped-not-a-dict": (lambda s: forged(s, skipped=[3]), r"Loader state has skipped\[0\]=3: expected a dict"),
    "skipped-missing-key": (lambda s: forged(s, skipped=[without(SKIP, "reason")], position=9),
                            r"Loader state has skipped\[0\] with keys .*expected.*reason"),
    "skipped-position-str": (lambda s: forged(s, skipped=[{**SKIP, "position": "3"}], position=9),
                             r"Loader state has skipped\[0\]\['position'\]='3': expected an int"),
    "skipped-position-past": (lambda s: forged(s, skipped=[{**SKIP, "position": 9}], position=9),
                              r"Loader state has skipped\[0\]\['position'\]=9: expected an int in 0\.\.8"),
    "skipped-index-past": (lambda s: forged(s, skipped=[{**SKIP, "index": N}], position=9),
                           rf"Loader state has skipped\[0\]\['index'\]={N}: expected an int in 0\.\.{N - 1}"),
    "skipped-other-epoch": (lambda s: forged(s, skipped=[{**SKIP, "epoch": 1}], position=9),
                            r"Loader state has skipped\[0\]\['epoch'\]=1 but epoch=0"),
    "skipped-source-int": (lambda s: forged(s, skipped=[{**SKIP, "source": 3}], position=9),
                           r"Loader state has skipped\[0\]\['source'\]=3: expected a str"),
    "skipped-twice": (lambda s: forged(s, skipped=[SKIP, SKIP], position=10),
                      r"Loader state has skipped\[1\]\['position'\]=3 twice"),
}


@pytest.fixture(scope="module")
def state(indexed_reader: Callable[[int], DatasetReader]) -> dict[str, Any]:
    loader = Loader(indexed_reader(N), BATCH, transform=[CenterCrop(4)], seed=2, num_threads=1)
    state = taken(loader, 2)
    assert (field(state, "position"), field(state, "batches"), field(state, "repeat")) == (8, 2, 0)
    return state


@pytest.mark.parametrize("name", sorted(FORGED))
def test_a_forged_state_is_refused_when_it_loads(make: Callable[..., Loader], state: dict[str, Any],
                                                  name: str) -> None:
    forge, match = FORGED[name]
    bad = forge(state)
    with pytest.raises(ValueError, match=match):
        make().load_state_dict(bad)


def test_a_refused_state_leaves_the_pass_in_progress_alone(make: Callable[..., Loader], state: dict[str, Any]) -> None:
    loader = make()
    it = iter(loader)
    next(it)
    before = loader.state_dict()
    with pytest.raises(ValueError, match="batcher.batches=-2"):
        loader.load_state_dict(forged(state, batches=-2))
    assert loader.state_dict() == before
    assert len([next(it), *it]) == len(loader) - 1


def test_a_state_between_repeats_is_consistent_with_the_echo(make: Callable[..., Loader]) -> None:
    state = taken(make(echo=2, echo_mode="batch"), 3)
    assert (field(state, "position"), field(state, "repeat"), field(state, "batches")) == (4, 1, 3)
    with pytest.raises(ValueError, match=r"Loader state has batcher\.repeat=0 but batcher\.batches=3"):
        make(echo=2, echo_mode="batch").load_state_dict(forged(state, repeat=0))
    with pytest.raises(ValueError, match=r"repeat=2: expected an int in 0\.\.1"):
        make(echo=2, echo_mode="batch").load_state_dict(forged(state, repeat=2))


@pytest.mark.parametrize("kwargs", [{}, {"drop_last": True}, {"echo": 2, "echo_mode": "batch"},
                                    {"echo": 2, "echo_mode": "example"}], ids=str)
def test_every_state_a_run_takes_loads(make: Callable[..., Loader], kwargs: dict[str, Any]) -> None:
    loader = make(**kwargs)
    states = [json.loads(json.dumps(loader.state_dict()))]
    for _ in loader:
        states.append(json.loads(json.dumps(loader.state_dict())))
    states.append(json.loads(json.dumps(loader.state_dict())))  # the next epoch's start
    for state in states:
        make(**kwargs).load_state_dict(state)


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (6, 6, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("bad", [(0,), (7, 8), (9,)], ids=str)
def test_every_state_of_a_run_with_skips_and_wraps_loads(tmp_path: Path, bad: tuple[int, ...]) -> None:
    # 10 rows, batches of 4: the last batch's refills wrap round to the start of the stream, past a skipped row
    lines = ["path,label"]
    for i in range(10):
        (tmp_path / f"{i}.img").write_bytes(b"" if i in bad else _png(i))
        lines.append(f"{i}.img,{i}")
    (tmp_path / "list.csv").write_text("\n".join(lines) + "\n")

    def make() -> Loader:
        return Loader(tmp_path / "list.csv", 4, transform=[CenterCrop(4)], shuffle=False, num_threads=1,
                      on_error="skip")

    loader = make()
    states = [json.loads(json.dumps(loader.state_dict())) for _ in loader]
    assert states[-1]["skipped"] and field(states[-1], "position") > 10
    for state in states:
        make().load_state_dict(state)
    with pytest.raises(ValueError, match=r"Loader state has batcher\.position=\d+ but batcher\.batches=3"):
        make().load_state_dict(forged(states[-1], skipped=[]))
