"""`stallfree bench packing`: tiny mixes end to end, the result's shape, what it measures, argument errors.

No timing is asserted: rates on a shared 2-core machine say nothing about correctness.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest

from stallfree.bench.packing_feeds import CONTENDERS, skip_reason
from stallfree.bench.packing_mixes import MIXES, prepare
from stallfree.cli import main

TINY = ["--seq-len", "256", "--tokens", "20000", "--repeats", "2", "--warmup", "1", "--workers", "0", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    """One tiny run of every mix and contender: its JSON, its table (stdout) and its DATA folder."""
    root = tmp_path_factory.mktemp("packing")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "packing", str(root / "data"), *TINY, "--json-file", str(root / "packing.json")])
    assert code == 0
    return json.loads((root / "packing.json").read_text()), out.getvalue(), root / "data"


def test_every_mix_and_contender_has_a_row_with_efficiency_in_0_1(tiny_run: tuple[dict, str, Path]) -> None:
    result, table, _ = tiny_run
    assert set(result["mixes"]) == set(MIXES)
    assert [(r["mix"], r["contender"]) for r in result["results"]] == [(m, c) for m in MIXES for c in CONTENDERS]
    for r in result["results"]:
        if r["contender"] == "trl-bfd" and importlib.util.find_spec("trl") is None:
            assert "trl" in r["skipped"] and "stallfree[bench]" in r["skipped"]
            continue
        assert "skipped" not in r, r
        assert 0 < r["efficiency"] <= 1 and 0 < r["static_efficiency"] <= r["efficiency"]
        assert r["tokens_per_s"] > 0 and r["cores"] >= 0
        assert len(r["passes"]) == 2 and all(p["whole_epoch"] for p in r["passes"])
    for name, mix in result["mixes"].items():
        assert mix["tokens"] >= 20000 and mix["documents"] > 0 and mix["lengths"] == MIXES[name].lengths
    assert "| chat | stallfree packed | [8, 256] |" in table
    assert "For scale (an estimate, not measured)" in table and "Targets, stallfree packed" in table


def test_packing_beats_padding_on_chat_and_no_feed_but_trl_loses_a_token(tiny_run: tuple[dict, str, Path]) -> None:
    result, _, _ = tiny_run
    rows = {(r["mix"], r["contender"]): r for r in result["results"]}
    assert rows["chat", "packed"]["efficiency"] > rows["chat", "padded"]["efficiency"]
    assert rows["chat", "packed"]["efficiency"] > rows["chat", "torch-pad"]["efficiency"]
    for (mix, contender), r in rows.items():
        if contender != "trl-bfd":  # every token of the mix delivered in each epoch, none twice
            assert r["lost_tokens"] == 0, (mix, contender)
            assert {p["real_tokens"] for p in r["passes"]} == {result["mixes"][mix]["tokens"]}
    if "skipped" not in rows["long", "trl-bfd"]:  # bfd truncates: the long mix's overflow past S is gone
        assert rows["long", "trl-bfd"]["lost_tokens"] > 0
    for contender in ("torch-flat", "trl-bfd"):  # padding-free: 1.0 by construction, the shape varies
        r = rows["chat", contender]
        if "skipped" not in r:
            assert r["efficiency"] == 1.0 and r["shape_min"][0] == 1


def test_the_same_settings_reuse_data_and_draw_the_same_documents(tiny_run: tuple[dict, str, Path],
                                                                   tmp_path: Path) -> None:
    _, _, data = tiny_run
    again = prepare(tmp_path / "again", ["chat"], tokens=20000, seq_len=256, seed=0, vocab=32000, progress=False)
    reused = prepare(data, ["chat"], tokens=20000, seq_len=256, seed=0, vocab=32000, progress=False)
    assert np.array_equal(again["chat"].lengths, reused["chat"].lengths)
    other = prepare(tmp_path / "other", ["chat"], tokens=20000, seq_len=256, seed=1, vocab=32000, progress=False)
    assert not np.array_equal(other["chat"].lengths, reused["chat"].lengths)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seq-len", "1"], "--seq-len must be >= 2 (tokens per packed row), got 1"),
        (["--tokens", "0"], "--tokens must be positive, got 0"),
        (["--batches", "0"], "--batches must be positive (or left out: a whole epoch), got 0"),
        (["--vocab-size", "1"], "--vocab-size must be in 2 .. 2**31"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, extra: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "packing", str(tmp_path / "data"), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "data").exists()  # refused before anything was written


def test_a_non_empty_data_folder_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("mine")
    assert main(["bench", "packing", str(data), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert f"DATA {data} is not empty and holds no bench packing data" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in data.iterdir()) == ["notes.txt"]  # nothing written beside the user's file


def test_data_of_other_settings_is_refused(tiny_run: tuple[dict, str, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _, _, data = tiny_run
    assert main(["bench", "packing", str(data), *TINY, "--seed", "7", "--mixes", "chat"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"DATA {data} holds bench packing data made with other settings" in err and len(err.splitlines()) == 1


def test_the_dataloaders_workers_deliver_every_token(tiny_run: tuple[dict, str, Path], tmp_path: Path) -> None:
    _, _, data = tiny_run
    path = tmp_path / "workers.json"
    args = [*TINY, "--workers", "1", "--repeats", "1", "--mixes", "chat", "--contenders", "torch-pad", "torch-flat"]
    assert main(["bench", "packing", str(data), *args, "--json-file", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["workers"] == 1
    for r in result["results"]:  # documents read in a worker process, collated there, every token once
        assert r["passes"][0]["real_tokens"] == result["mixes"]["chat"]["tokens"] and r["lost_tokens"] == 0


def test_trl_is_skipped_with_a_line_saying_so_where_it_does_not_import(monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else found(name, *a))
    assert skip_reason("trl-bfd") == "trl not importable (pip install 'stallfree[bench]')"
    assert skip_reason("packed") is None
