"""docs/sequences.md's image-text example runs as written, and gives what its comments say."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_image_text_example_runs_and_gives_what_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "sequences.md").read_text()
    section = re.search(r"^## Image-text samples\n(.*?)^## ", text, re.S | re.M)
    assert section is not None, "docs/sequences.md has no '## Image-text samples' section"
    code = re.search(r"^```python\n(.*?)^```", section[1], re.S | re.M)
    assert code is not None
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(code[1], "docs/sequences.md", "exec"), scope)  # noqa: S102 - the docs' own example
    batch = scope["batch"]
    assert batch["input_ids"].shape == (2, 64)
    images = len(batch["pixel_values"])
    assert images > 0 and tuple(batch["pixel_values"].shape[1:]) == (3, 28, 28)
    assert int((batch["input_ids"] == 1).sum()) == 4 * images  # 4 positions of id 1 per image, as it says
    assert int((batch["labels"][batch["input_ids"] == 1] != -100).sum()) == 0
    assert len(batch["image_document_index"]) == images


def test_the_read_in_place_example_runs_and_gives_the_ingested_batch(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from stallfree import Loader, Packing
    from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text
    from stallfree.transforms import Normalize, Resize

    text = (ROOT / "docs" / "sequences.md").read_text()
    section = re.search(r"^## Image-text samples\n(.*?)^## ", text, re.S | re.M)
    assert section is not None
    code = next((block for block in re.findall(r"^```python\n(.*?)^```", section[1], re.S | re.M)
                 if "ImageTextFileReader" in block), None)
    assert code is not None, "the section has no example of ImageTextFileReader"
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/sequences.md", "exec"), scope)  # noqa: S102 - the docs' own example
    reader, batch = scope["reader"], scope["batch"]
    assert len(reader) == 12
    assert [r["path"] for r in reader.rejected] == ["llava.jsonl:12"]
    assert "missing.png" in reader.rejected[0]["reason"] and "no such file" in reader.rejected[0]["reason"]
    images = len(batch["pixel_values"])
    assert images > 0 and tuple(batch["pixel_values"].shape[1:]) == (3, 28, 28)
    assert int((batch["input_ids"] == 1).sum()) == 4 * images
    tokenizer = scope["tokenizer"]
    targets = batch["labels"][batch["labels"] != -100].tolist()
    said = tokenizer.decode(targets, skip_special_tokens=False)
    assert said.startswith("It is ") and said.endswith(".</s>") and "USER" not in said, said
    ingest_image_text("llava.jsonl", "shards", ImageTextOptions(layout="conversations", tokenizer="tokenizer.json"))
    same = Loader("shards", batch_size=2, seed=0, shuffle=True, transform=[Resize((28, 28)), Normalize()],
                  packing=Packing(seq_len=256, image_tokens=4, image_token_id=1, train_on="assistant"))  # the example's
    ingested = next(iter(same))
    for name in ("input_ids", "labels", "position_ids", "document_index", "pixel_values", "image_document_index"):
        assert torch.equal(torch.as_tensor(batch[name]), torch.as_tensor(ingested[name])), name
