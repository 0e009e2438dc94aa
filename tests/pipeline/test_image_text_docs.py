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
