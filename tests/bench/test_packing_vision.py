"""`stallfree bench packing --mixes image-text` (issue 47, item 5): captioned images packed with their vision tokens
beside a DataLoader with PIL decode, a resize and transformers' padding collator, on the same shards.

No timing is asserted: rates on a shared 2-core machine say nothing about correctness.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from stallfree.bench.packing_vision import IMAGE_TOKENS, VISION_CONTENDERS, ShardImageText, resizer
from stallfree.cli import main

pytestmark = pytest.mark.slow  # the module's run generates, ingests and decodes photograph-sized JPEGs
TINY = ["--mixes", "image-text", "--images", "24", "--seq-len", "1024", "--batch-size", "2", "--repeats", "1",
        "--warmup", "0", "--workers", "0", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    root = tmp_path_factory.mktemp("packing-vision")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "packing", str(root / "data"), *TINY, "--json-file", str(root / "packing.json")])
    assert code == 0
    return json.loads((root / "packing.json").read_text()), out.getvalue(), root / "data"


def test_both_contenders_deliver_every_image_and_token_with_vision_tokens_counted(
        tiny_run: tuple[dict, str, Path]) -> None:
    result, table, _ = tiny_run
    mix = result["mixes"]["image-text"]
    assert mix["documents"] == 24 and mix["tokens"] > 24 * IMAGE_TOKENS  # each image's 576 tokens + its text
    assert [r["contender"] for r in result["results"]] == list(VISION_CONTENDERS)
    for r in result["results"]:
        (one,) = r["passes"]
        assert one["images"] == 24 and one["real_tokens"] == mix["tokens"], r  # the epoch: every image, every token
        assert 0 < r["efficiency"] <= 1 and r["samples_per_s"] > 0
    assert "samples/s" in table and "resized to 336x336" in table
    assert resizer()[1] in table  # the DataLoader's resize, named: torchvision's where it imports, else PIL's


def test_the_dataloaders_rows_are_576_image_ids_then_the_text_and_a_336_image(tiny_run: tuple[dict, str, Path]) -> None:
    _, _, data = tiny_run
    rows = ShardImageText(data / "image-text", image_token_id=99)
    row = rows[0]
    assert row["input_ids"][:IMAGE_TOKENS] == [99] * IMAGE_TOKENS and 99 not in row["input_ids"][IMAGE_TOKENS:]
    assert tuple(row["pixel_values"].shape) == (1, 3, 336, 336)


def test_a_rerun_with_other_settings_is_refused_in_one_line(tiny_run: tuple[dict, str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, _, data = tiny_run
    assert main(["bench", "packing", str(data), *TINY, "--images", "30"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds an image-text mix made with other settings" in err and len(err.splitlines()) == 1


def test_no_images_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "packing", str(tmp_path / "data"), *TINY, "--images", "0"]) == 2
    assert capsys.readouterr().err.strip().endswith("--images must be positive, got 0")
    assert not (tmp_path / "data").exists()
