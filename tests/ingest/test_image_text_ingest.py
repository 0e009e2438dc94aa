"""``ingest_image_text``: caption pairs and LLaVA conversations from JSON Lines, Parquet and a ``datasets.Dataset``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallfree.ingest.conversation import LLAVA_SYSTEM
from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text
from stallfree.ingest.manifest import read_manifest


@pytest.fixture(scope="module")
def tokenizer(bpe_tokenizer: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(bpe_tokenizer))


@pytest.fixture
def images(encode, tmp_path: Path) -> list[Path]:
    """Four PNGs of sizes 10x12 .. 13x15 in ``tmp_path/img``."""
    folder = tmp_path / "img"
    folder.mkdir()
    paths = []
    for i in range(4):
        path = folder / f"{i}.png"
        path.write_bytes(encode(i, (10 + i, 12 + i), "PNG"))
        paths.append(path)
    return paths


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def decode(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def test_caption_pairs_hold_their_images_then_their_text_all_targets(images, bpe_tokenizer, tokenizer, shard_rows,
                                                                     tmp_path):
    rows = [{"image": "img/0.png", "text": "a red circle on the left"},
            {"images": ["img/1.png", str(images[2])], "text": "two squares"}]  # a list; an absolute path
    source = write_jsonl(tmp_path / "caps.jsonl", rows)
    summary = ingest_image_text(source, tmp_path / "out", ImageTextOptions(tokenizer=str(bpe_tokenizer)))
    assert summary["documents"] == 2 and summary["images"] == 3 and summary["rejected"] == 0
    got = shard_rows(tmp_path / "out")
    assert [r["tokens"] for r in got] == [tokenizer.encode(r["text"]).ids for r in rows]
    assert [r["images"] for r in got] == [[images[0].read_bytes()], [images[1].read_bytes(), images[2].read_bytes()]]
    assert [r["image_at"] for r in got] == [[0], [0, 0]]
    assert [r["image_sizes"] for r in got] == [[10, 12], [11, 13, 12, 14]]
    assert all(r["assistant"] == [1] * r["length"] for r in got)
    assert [r["source"] for r in got] == ["caps.jsonl:0", "caps.jsonl:1"]
    manifest = read_manifest(tmp_path / "out")
    assert manifest["kind"] == "image_text" and manifest["layout"] == "caption" and manifest["images"] == 3
    assert np.load(tmp_path / "out" / "image_counts.npy").tolist() == [1, 2]
    assert np.load(tmp_path / "out" / "lengths.npy").tolist() == [r["length"] for r in got]


def test_a_conversation_is_rendered_in_llava_v1s_template_with_each_image_at_its_placeholder(
        images, bpe_tokenizer, tokenizer, shard_rows, tmp_path):
    turns = [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A circle."},
             {"from": "human", "value": "And this <image> one?"}, {"from": "gpt", "value": "A square."}]
    source = write_jsonl(tmp_path / "chat.jsonl", [{"images": ["img/0.png", "img/1.png"], "conversations": turns}])
    ingest_image_text(source, tmp_path / "out", ImageTextOptions(layout="conversations", tokenizer=str(bpe_tokenizer)))
    (row,) = shard_rows(tmp_path / "out")
    ids, (first, second) = row["tokens"], row["image_at"]
    assert decode(tokenizer, ids[:first]) == f"{LLAVA_SYSTEM} USER: "
    assert decode(tokenizer, ids[first:second]) == "\nWhat is it? ASSISTANT: A circle.</s>USER: And this "
    assert decode(tokenizer, ids[second:]) == " one? ASSISTANT: A square.</s>"
    targets = [i for i, a in zip(ids, row["assistant"], strict=True) if a]
    assert decode(tokenizer, targets) == "A circle.</s>A square.</s>"
    assert row["image_sizes"] == [10, 12, 11, 13]


def test_role_content_keys_content_parts_a_system_turn_and_images_without_placeholders(
        images, bpe_tokenizer, tokenizer, shard_rows, tmp_path):
    parts = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]},
             {"role": "assistant", "content": "Red."}]
    plain = [{"from": "human", "value": "Shape?"}, {"from": "gpt", "value": "Round."}]
    source = write_jsonl(tmp_path / "chat.jsonl", [
        {"image": "img/0.png", "messages": parts},
        {"image": "img/1.png", "messages": plain},  # no placeholder: the image goes before the first turn
        {"messages": plain},  # no image: a text-only conversation
    ])
    ingest_image_text(source, tmp_path / "out", ImageTextOptions(layout="conversations", tokenizer=str(bpe_tokenizer),
                                                                 conversations_field="messages"))
    one, two, three = shard_rows(tmp_path / "out")
    assert decode(tokenizer, one["tokens"][: one["image_at"][0]]) == "Be brief. USER: "
    assert decode(tokenizer, one["tokens"][one["image_at"][0] :]) == "Colour? ASSISTANT: Red.</s>"
    assert decode(tokenizer, two["tokens"][: two["image_at"][0]]) == f"{LLAVA_SYSTEM} "
    assert decode(tokenizer, two["tokens"][two["image_at"][0] :]) == "USER: Shape? ASSISTANT: Round.</s>"
    assert three["images"] == [] and three["image_at"] == [] and three["tokens"] == two["tokens"]


def test_parquet_bytes_and_a_datasets_dataset_give_the_shards_of_the_same_rows_as_json_lines(
        images, bpe_tokenizer, shard_rows, tmp_path):
    import datasets

    texts = ["a red circle", "a blue square", "a green triangle"]
    options = ImageTextOptions(tokenizer=str(bpe_tokenizer))
    ingest_image_text(write_jsonl(tmp_path / "caps.jsonl", [{"image": f"img/{i}.png", "text": t}
                                                            for i, t in enumerate(texts)]), tmp_path / "a", options)
    blobs = [images[i].read_bytes() for i in range(3)]
    pq.write_table(pa.table({"image": blobs, "text": texts}), tmp_path / "caps.parquet")
    ingest_image_text(tmp_path / "caps.parquet", tmp_path / "b", options)
    dataset = datasets.Dataset.from_dict({"image": [str(p) for p in images[:3]], "text": texts}).cast_column(
        "image", datasets.Image())
    ingest_image_text(dataset, tmp_path / "c", options)
    expected = [{k: v for k, v in r.items() if k != "source"} for r in shard_rows(tmp_path / "a")]
    for name, file in (("b", "caps.parquet"), ("c", "dataset")):
        got = shard_rows(tmp_path / name)
        assert [{k: v for k, v in r.items() if k != "source"} for r in got] == expected
        assert [r["source"] for r in got] == [f"{file}:{i}" for i in range(3)]


def test_llavas_json_array_and_trls_images_and_messages_dataset_are_read_as_rows(images, bpe_tokenizer,
                                                                                 shard_rows, tmp_path):
    import datasets

    turns = [{"from": "human", "value": "<image>\nWhat is it?"}, {"from": "gpt", "value": "A circle."}]
    (tmp_path / "llava.json").write_text(json.dumps([{"id": "a", "image": "img/0.png", "conversations": turns},
                                                     {"id": "b", "image": "img/1.png", "conversations": turns}],
                                                    indent=1))
    options = ImageTextOptions(layout="conversations", tokenizer=str(bpe_tokenizer))
    assert ingest_image_text(tmp_path / "llava.json", tmp_path / "a", options)["documents"] == 2
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "\nWhat is it?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A circle."}]}]
    dataset = datasets.Dataset.from_dict({"images": [[str(images[0])], [str(images[1])]],
                                          "messages": [messages, messages]})
    dataset = dataset.cast_column("images", datasets.Sequence(datasets.Image()))
    ingest_image_text(dataset, tmp_path / "b", ImageTextOptions(layout="conversations", tokenizer=str(bpe_tokenizer),
                                                                conversations_field="messages"))
    from_json, from_dataset = shard_rows(tmp_path / "a"), shard_rows(tmp_path / "b")
    assert [r["source"] for r in from_json] == ["llava.json:0", "llava.json:1"]
    assert [{**r, "source": ""} for r in from_json] == [{**r, "source": ""} for r in from_dataset]
    assert from_json[1]["images"] == [images[1].read_bytes()]


def test_a_transformers_tokenizers_bos_goes_before_the_image(images, bpe_tokenizer, tokenizer, shard_rows, tmp_path):
    from tokenizers import Tokenizer, processors

    with_bos = Tokenizer.from_file(str(bpe_tokenizer))
    with_bos.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    with_bos.save(str(tmp_path / "bos.json"))
    source = write_jsonl(tmp_path / "caps.jsonl", [{"image": "img/0.png", "text": "a cat"}])
    ingest_image_text(source, tmp_path / "out", ImageTextOptions(tokenizer=str(tmp_path / "bos.json"),
                                                                 add_eos="</s>"))
    (row,) = shard_rows(tmp_path / "out")
    assert row["tokens"] == [1, *tokenizer.encode("a cat").ids, 2] and row["image_at"] == [1]
    assert row["assistant"] == [1] * row["length"]


def test_a_transformers_folders_bos_starts_a_conversation_and_its_eos_ends_each_reply(images, bpe_tokenizer,
                                                                                      tokenizer, shard_rows, tmp_path):
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_file(str(bpe_tokenizer))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="<pad>",  # an EOS of its own
                            pad_token="<pad>").save_pretrained(tmp_path / "tok")
    turns = [{"from": "human", "value": "Hi <image>"}, {"from": "gpt", "value": "Hello."}]
    source = write_jsonl(tmp_path / "chat.jsonl", [{"image": "img/0.png", "conversations": turns}])
    options = ImageTextOptions(layout="conversations", tokenizer=str(tmp_path / "tok"))
    ingest_image_text(source, tmp_path / "out", options)
    (row,) = shard_rows(tmp_path / "out")
    ids, (at,) = row["tokens"], row["image_at"]
    assert ids[0] == 1 and decode(tokenizer, ids[1:at]) == f"{LLAVA_SYSTEM} USER: Hi "
    assert decode(tokenizer, ids[at:]) == " ASSISTANT: Hello.<pad>" and ids[-1] == 0
    targets = [i for i, a in zip(ids, row["assistant"], strict=True) if a]
    assert decode(tokenizer, targets) == "Hello.<pad>"
    assert read_manifest(tmp_path / "out")["tokenizer"]["reply_end"] == "<pad>"


def test_a_missing_column_of_a_parquet_file_is_an_error_naming_it_and_the_flag(bpe_tokenizer, tmp_path):
    pq.write_table(pa.table({"picture": [b"x"], "caption": ["a"]}), tmp_path / "caps.parquet")
    with pytest.raises(ValueError, match=r"caps\.parquet has no column 'text' nor 'image or images' for --layout "
                                         r"caption; its columns are \['picture', 'caption'\]: name them with "
                                         r"--image-field/--text-field"):
        ingest_image_text(tmp_path / "caps.parquet", tmp_path / "out", ImageTextOptions(tokenizer=str(bpe_tokenizer)))
    ingest_image_text(tmp_path / "caps.parquet", tmp_path / "out", ImageTextOptions(
        tokenizer=str(bpe_tokenizer), image_field="picture", text_field="caption"))  # named: read (its row is bad)
    assert read_manifest(tmp_path / "out")["rejected"] == 1


_TURNS = [{"from": "human", "value": "<image> <image> Same?"}, {"from": "gpt", "value": "No."}]
_BAD_ROWS = [
    ("caption", {"image": "img/nope.png", "text": "a"}, r"image 0 \(img/nope\.png\): no such file \S+nope\.png"),
    ("caption", {"images": ["img/0.png", "img/cut.jpg"], "text": "a"},
     r"image 1 \(img/cut\.jpg\): truncated JPEG"),
    ("caption", {"image": "../img/0.png", "text": "a"}, r"image 0 \(\.\./img/0\.png\): path escapes the source root"),
    ("caption", {"image": "img/notes.txt", "text": "a"}, r"image 0 \(img/notes\.txt\): not an image"),
    ("caption", {"image": "img/0.png", "text": "  "}, "text: empty text"),
    ("caption", {"image": "img/0.png"}, r"no field 'text' \(its fields: \['image'\]\)"),
    ("caption", {"text": "a"}, r"no field 'image' nor 'images' \(its fields: \['text'\]\)"),
    ("caption", {"image": None, "text": "a"}, "no image: a caption pair needs one or more"),
    ("caption", {"image": 7, "text": "a"}, r"image is no image \(a path, bytes or \{'bytes', 'path'\}"),
    ("conversations", {"image": "img/0.png", "conversations": _TURNS},
     r"2 <image> placeholder\(s\) for 1 image\(s\)"),
    ("conversations", {"conversations": _TURNS}, r"2 <image> placeholder\(s\) for 0 image\(s\)"),
    ("conversations", {"image": "img/0.png", "conversations": [{"from": "bot", "value": "hi"}]},
     r"conversations\[0\] has role 'bot'"),
    ("conversations", {"conversations": [{"from": "human", "value": "hi"}]},
     r"conversations: no assistant \('gpt'/'assistant'\) turn"),
    ("conversations", {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]},
     r"conversations\[1\]'s text: empty text"),
    ("conversations", {"image": "img/0.png"}, r"no field 'conversations'"),
]


def _with_bad_row(folder: Path, images: list[Path], layout: str, bad: dict) -> Path:
    (folder / "img" / "cut.jpg").write_bytes(_cut_jpeg(images[3]))
    (folder / "img" / "notes.txt").write_text("not an image at all")
    good = ({"image": "img/2.png", "text": "a good row"} if layout == "caption" else
            {"image": "img/2.png", "conversations": [{"from": "human", "value": "<image>Hi"},
                                                     {"from": "gpt", "value": "Hello."}]})
    return write_jsonl(folder / "rows.jsonl", [good, bad, good])


def _cut_jpeg(png: Path) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.open(png).convert("RGB").save(buffer, "JPEG")
    return buffer.getvalue()[:-200]  # cut: no end-of-image marker


@pytest.mark.parametrize(("layout", "bad", "reason"), _BAD_ROWS)
def test_a_bad_row_raises_naming_the_file_and_row(layout, bad, reason, images, bpe_tokenizer, tmp_path):
    source = _with_bad_row(tmp_path, images, layout, bad)
    options = ImageTextOptions(layout=layout, tokenizer=str(bpe_tokenizer), on_error="raise")
    with pytest.raises(ValueError, match=rf"rows\.jsonl row 1: {reason}.*pass --on-error skip"):
        ingest_image_text(source, tmp_path / "out", options)


@pytest.mark.parametrize(("layout", "bad", "reason"), _BAD_ROWS)
def test_a_bad_row_is_left_out_whole_and_listed(layout, bad, reason, images, bpe_tokenizer, shard_rows, tmp_path):
    source = _with_bad_row(tmp_path, images, layout, bad)
    summary = ingest_image_text(source, tmp_path / "out", ImageTextOptions(layout=layout,
                                                                           tokenizer=str(bpe_tokenizer)))
    assert summary["documents"] == 2 and summary["rejected"] == 1 and summary["images"] == 2
    assert [r["source"] for r in shard_rows(tmp_path / "out")] == ["rows.jsonl:0", "rows.jsonl:2"]
    (listed,) = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert listed["path"] == "rows.jsonl:1"
    assert re.match(reason, listed["reason"])
