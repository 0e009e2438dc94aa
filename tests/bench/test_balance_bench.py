"""`stallfree bench balance`: tiny mixes end to end, the result's shape and invariants, the books it reads.

No timing is asserted: the simulated step is a function of the documents, and planning seconds on a shared 2-core
machine say nothing about correctness.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from stallfree import Cost, Loader, Packing
from stallfree.bench.balance_feeds import CONTENDERS
from stallfree.bench.balance_images import IMAGE_TOKEN_ID, image_text_loader_options, write_mix
from stallfree.bench.balance_mixes import MIXES, draw
from stallfree.bench.balance_units import Units, delivered_pieces
from stallfree.cli import main

TINY = ["--seq-len", "256", "--tokens", "15000", "--batch-size", "4", "--microbatches", "2", "--seeds", "2",
        "--no-progress"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """One tiny run of every mix, layout and contender: its JSON and its table (stdout)."""
    path = tmp_path_factory.mktemp("balance") / "balance.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "balance", *TINY, "--json-file", str(path)]) == 0
    return json.loads(path.read_text()), out.getvalue()


def test_every_mix_layout_and_contender_has_a_row_and_no_unit_beats_the_ideal(tiny_run: tuple[dict, str]) -> None:
    result, table = tiny_run
    rows = {(r["mix"], r["layout"], r["contender"]): r for r in result["results"]}
    expected = {(m, lay, c) for m in MIXES for lay in ("dp4", "dp2-pp2") for c in CONTENDERS}
    assert set(rows) == expected
    for key, r in rows.items():
        assert len(r["seeds"]) == 2, key
        for seed in r["seeds"]:  # a step lasts at least its mean unit: the epoch at least the ideal
            assert seed["slowest_over_ideal"] >= 1 - 1e-9 and seed["epoch_s"] >= seed["ideal_s"] > 0, key
            assert seed["tokens_per_s"] <= seed["ideal_tokens_per_s"] * (1 + 1e-9), key
            assert 0 <= seed["padding"] < 1 and seed["plan_s"] >= 0, key
        assert r["gain"] == (None if r["seeds"][0]["gain"] is None else r["gain"])
    for mix in MIXES:  # every contender of a mix delivers the same documents, so the ideal is the same
        ideals = [r["ideal_s"] for (m, layout, _), r in rows.items() if m == mix and layout == "dp4"]
        assert max(ideals) == pytest.approx(min(ideals)), mix
    assert "| chat | DP 4 | balance=\"compute\" |" in table and "2 DP x 2 stages, M = 2" in table
    assert "read by the Loader with Packing(image_tokens=16, image_token_id=2)" in table
    assert "Targets, compute on chat:" in table and "Targets, compute on image-text:" in table


def test_the_loaders_delivered_micro_batches_cost_what_its_plan_said(tiny_run: tuple[dict, str]) -> None:
    result, _ = tiny_run
    rows = {(r["mix"], r["layout"], r["contender"]): r for r in result["results"]}
    for layout in ("dp4", "dp2-pp2"):
        assert rows["chat", layout, "compute"]["planned_matches"] is True  # cost = the simulator's: read back equal
        # the Loader's image-text documents: its plan charged each image Cost.image, as the simulator does
        assert rows["image-text", layout, "compute"]["planned_matches"] is True


def test_delivered_pieces_reads_documents_and_pieces_back_from_a_batch() -> None:
    # rows of 6: doc 0 (4 tokens) + doc 1's first 2; doc 1's last 3 (positions 2..4) + padding; micro-batches of 1 row
    batch = {"document_index": torch.tensor([[0, 0, 0, 0, 1, 1], [1, 1, 1, -1, -1, -1]]),
             "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1], [2, 3, 4, 0, 0, 0]])}
    first, second = delivered_pieces(batch, 2)
    assert first.rows.tolist() == [0, 1] and first.tokens.tolist() == [4, 2] and first.first.tolist() == [True, True]
    assert second.rows.tolist() == [1] and second.tokens.tolist() == [3] and second.first.tolist() == [False]
    Units([[[first, second]]]).check_once(np.array([4, 5]))  # each document once: no error
    # twice: doc 0 has as many tokens as a length of 8 would, but two starts; doc 1 too many tokens
    with pytest.raises(RuntimeError, match=r"document 0 \(8 tokens\) came as 8 tokens in 2 starts \(2 documents"):
        Units([[[first, second, first, second]]]).check_once(np.array([8, 5]))


def test_the_image_text_mix_is_read_as_image_text_documents_with_their_images(tmp_path: Path) -> None:
    """Written as image-text shards, the mix's documents come out of the Loader with their images: every position
    once (images' counted), and as many images in ``pixel_values`` as the mix drew."""
    mix = draw("image-text", 20_000, 512, 0)
    folder = write_mix(mix, tmp_path / "shards")
    packing = Packing(seq_len=512, image_tokens=mix.image_tokens, image_token_id=IMAGE_TOKEN_ID, balance="compute",
                      cost=Cost(1.0, 1 / 512, 512.0))
    with Loader(folder, 4, packing=packing, shuffle=True, seed=0, **image_text_loader_options()) as loader:
        batches = list(loader)
        assert np.array_equal(loader.sampler.images, mix.images)
    pieces = [u for batch in batches for u in delivered_pieces(batch, 1)]
    Units([[pieces]]).check_once(mix.lengths)
    assert sum(int(b["pixel_values"].shape[0]) for b in batches) == int(mix.images.sum()) > 0
    assert (mix.image_tokens == 32) and int((mix.lengths - 32 * mix.images).min()) >= 1


def test_a_mix_is_the_same_for_the_same_seed_and_carries_images_where_it_says() -> None:
    a, b, c = draw("image-text", 50_000, 1024, 0), draw("image-text", 50_000, 1024, 0), draw("chat", 50_000, 1024, 0)
    assert np.array_equal(a.lengths, b.lengths) and np.array_equal(a.images, b.images)
    assert a.lengths.sum() >= 50_000 and a.images.sum() > 0 and c.images.sum() == 0
    assert not np.array_equal(draw("chat", 50_000, 1024, 1).lengths, c.lengths)


def test_help_states_the_cost_model_and_gives_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as end:
        main(["bench", "balance", "--help"])
    assert end.value.code == 0
    text = capsys.readouterr().out
    assert "l + l**2 / S + IMAGE_COST * k" in text and "sum over micro-batch slots" in text
    assert "examples:" in text and "stallfree bench balance --seq-len 8192" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seq-len", "1"], "--seq-len must be >= 2 (tokens per packed row), got 1"),
        (["--seeds", "0"], "--seeds must be positive, got 0"),
        (["--batch-size", "8", "--microbatches", "3"], "--batch-size 8 does not split into --microbatches 3"),
        (["--rate", "0"], "--rate must be > 0"),
        (["--seq-len", "16"], "--seq-len 16 is too short for the image-text mix"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(extra: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "balance", "--no-progress", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
