"""The generated caption dataset (issue 47, item 5): what each caption says is in its image, in the ingest's layouts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stallfree.ingest.synthetic_captions import COLOURS, PLACES, caption_vocabulary, make_caption_dataset


def test_each_caption_names_the_colour_and_place_of_the_shape_in_its_image(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in make_caption_dataset(tmp_path, count=24, seed=1).read_text().splitlines()]
    assert len(rows) == 24 and all(set(r) == {"image", "text"} for r in rows)
    for row in rows:
        words = row["text"].split()
        assert words[0] == "a" and words[-3:-1] in (["on", "the"], ["in", "the"]), row
        colour, place = words[1], words[-1]
        pixels = np.asarray(Image.open(tmp_path / row["image"]).convert("RGB"), np.float32)
        near = np.abs(pixels - np.asarray(COLOURS[colour], np.float32)).sum(-1) < 90  # the shape's pixels
        assert near.sum() > 20, row
        ys, xs = np.nonzero(near)
        fx, fy = PLACES[place]
        h, w = near.shape
        assert abs(xs.mean() / w - fx) < 0.12 and abs(ys.mean() / h - fy) < 0.12, row


def test_the_tokenizer_written_beside_knows_every_word_of_both_layouts(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    captions = make_caption_dataset(tmp_path, count=40)
    chats = make_caption_dataset(tmp_path, count=5, layout="conversations")
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == len(caption_vocabulary())
    texts = [json.loads(line)["text"] for line in captions.read_text().splitlines()]
    for line in chats.read_text().splitlines():
        turns = json.loads(line)["conversations"]
        assert [t["from"] for t in turns] == ["human", "gpt"] and turns[0]["value"].startswith("<image>\n")
        texts += [t["value"].replace("<image>", "") for t in turns]
    texts.append("USER: what is in the picture? ASSISTANT: a red cross on the left</s>")  # LLaVA v1's template
    for text in texts:
        assert "<unk>" not in tokenizer.encode(text).tokens, text
    assert tokenizer.encode("a b</s>").tokens == ["a", "<unk>", "</s>"]


def test_the_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    one, two = (make_caption_dataset(tmp_path / d, count=6, seed=3, vary_size=True) for d in ("one", "two"))
    assert one.read_bytes() == two.read_bytes()
    for row in one.read_text().splitlines():
        name = json.loads(row)["image"]
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"count": 0}, r"^count must be >= 1, got 0$"),
    ({"size": (8, 64)}, r"^size must be \(height, width\) with both sides >= 16, got \(8, 64\)$"),
    ({"layout": "chat"}, r"^layout must be 'caption' or 'conversations', got 'chat'$"),
])
def test_bad_arguments_are_refused_by_name(kwargs: dict, message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message):
        make_caption_dataset(tmp_path, **kwargs)
