"""Image-text samples read in place (issue 47, item 1): the batches of the same rows ingested, bit for bit."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from stallfree import ImageTextDatasetReader, ImageTextFileReader, Loader, Packing
from stallfree.ingest.image_refs import ImageProblem
from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text
from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

N, ID = 4, 7  # tokens per image, the image token id
FIELDS = ("input_ids", "labels", "position_ids", "document_index", "cu_seqlens", "max_seqlen", "pixel_values",
          "image_document_index", "columns")


def png(seed: int) -> bytes:
    """A small PNG of its own size and colours."""
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(8, 24)), int(rng.integers(8, 24))
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


@pytest.fixture
def images(tmp_path: Path) -> list[str]:
    """Eight PNGs in ``tmp_path/img``, named relative to ``tmp_path``."""
    (tmp_path / "img").mkdir()
    for i in range(8):
        (tmp_path / "img" / f"{i}.png").write_bytes(png(i))
    return [f"img/{i}.png" for i in range(8)]


WORDS = "a red circle on the left blue square right green triangle small large two of them".split()


def caption_rows(images: list[str], count: int = 14) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    rows: list[dict[str, Any]] = []
    for i in range(count):
        text = " ".join(rng.choice(WORDS, int(rng.integers(2, 12))))
        if i % 3 == 2:
            rows.append({"images": [images[i % 8], images[(i + 3) % 8]], "text": text})
        else:
            rows.append({"image": images[i % 8], "text": text})
    return rows


def conversation_rows(images: list[str], count: int = 12) -> list[dict[str, Any]]:
    rng = np.random.default_rng(2)
    rows: list[dict[str, Any]] = []
    for i in range(count):
        ask, reply = (" ".join(rng.choice(WORDS, int(rng.integers(1, 8)))) for _ in range(2))
        turns = [{"from": "human", "value": f"<image>\n{ask}?"}, {"from": "gpt", "value": reply}]
        if i % 4 == 3:  # a text-only conversation, as LLaVA's mix holds
            rows.append({"id": str(i), "conversations": [{"from": "human", "value": ask},
                                                         {"from": "gpt", "value": reply}]})
        elif i % 4 == 2:  # two images, the second at a placeholder of the second turn
            turns += [{"from": "human", "value": f"and <image> {ask}"}, {"from": "gpt", "value": reply}]
            rows.append({"id": str(i), "images": [images[i % 8], images[(i + 1) % 8]], "conversations": turns})
        else:
            rows.append({"id": str(i), "image": images[i % 8], "conversations": turns})
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def loader(source: Any, **kw: Any) -> Loader:
    packing = Packing(seq_len=kw.pop("seq", 96), window=8, image_tokens=N, image_token_id=ID,
                      train_on=kw.pop("train_on", "all"))
    return Loader(source, 3, transform=[RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()], packing=packing,
                  shuffle=True, seed=5, num_threads=1,
                  columns=kw.pop("columns", ["source", "image_count", "length"]), **kw)


def assert_same_batches(one: Loader, two: Loader) -> int:
    """Every batch of both, field by field, bit for bit; returns the images seen."""
    seen = 0
    mine, theirs = list(one), list(two)
    assert len(mine) == len(theirs) == len(one) > 1
    for a, b in zip(mine, theirs, strict=True):
        assert set(a) == set(b) >= set(FIELDS) - {"columns"}
        for name in set(FIELDS) & set(a):
            x, y = a[name], b[name]
            if isinstance(x, torch.Tensor):
                assert x.dtype == y.dtype and torch.equal(x, y), name
            elif isinstance(x, dict):
                assert set(x) == set(y), name
                for key in x:
                    assert np.array_equal(np.asarray(x[key]), np.asarray(y[key])), f"columns[{key!r}]"
            else:
                assert np.array_equal(np.asarray(x), np.asarray(y)), name
        seen += len(a["pixel_values"])
    return seen


def ingested(source: Any, tmp_path: Path, tokenizer: Path, layout: str, name: str = "shards", **kw: Any) -> Path:
    out = tmp_path / name
    ingest_image_text(source, out, ImageTextOptions(layout=layout, tokenizer=str(tokenizer), **kw))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("layout", ["caption", "conversations"])
def test_a_jsonl_file_read_in_place_gives_the_ingested_batches(layout: str, images: list[str], bpe_tokenizer: Path,
                                                               tmp_path: Path) -> None:
    rows = caption_rows(images) if layout == "caption" else conversation_rows(images)
    source = write_jsonl(tmp_path / f"{layout}.jsonl", rows)
    shards = ingested(source, tmp_path, bpe_tokenizer, layout)
    reader = ImageTextFileReader(source, tokenizer=bpe_tokenizer, layout=layout)  # type: ignore[arg-type]
    assert len(reader) == len(rows) and reader.rejected == []
    kw = {"train_on": "assistant", "seq": 320} if layout == "conversations" else {}
    assert assert_same_batches(loader(shards, **kw), loader(reader, **kw)) == \
        sum(len(r.get("images", [])) + ("image" in r) for r in rows)


def test_llavas_json_array_and_a_folder_of_files_give_the_ingested_batches(images: list[str], bpe_tokenizer: Path,
                                                                          tmp_path: Path) -> None:
    rows = conversation_rows(images)
    (tmp_path / "llava.json").write_text(json.dumps(rows, indent=1))  # LLaVA's one array
    shards = ingested(tmp_path / "llava.json", tmp_path, bpe_tokenizer, "conversations")
    reader = ImageTextFileReader(tmp_path / "llava.json", bpe_tokenizer, "conversations")
    assert_same_batches(loader(shards, seq=320), loader(reader, seq=320))
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "a.jsonl", rows[:7])
    write_jsonl(tmp_path / "data" / "b.jsonl", rows[7:])
    shards = ingested(tmp_path / "data", tmp_path, bpe_tokenizer, "conversations", name="folder",
                      image_root=str(tmp_path))
    reader = ImageTextFileReader(tmp_path / "data", bpe_tokenizer, "conversations", image_root=tmp_path)
    assert reader.column("source", np.array([0, 7])) == ["a.jsonl:0", "b.jsonl:0"]
    assert_same_batches(loader(shards, seq=320), loader(reader, seq=320))


def test_parquet_bytes_and_a_datasets_dataset_give_the_ingested_batches(images: list[str], bpe_tokenizer: Path,
                                                                       tmp_path: Path) -> None:
    import datasets

    rows = caption_rows(images)
    blobs = [[(tmp_path / p).read_bytes() for p in r.get("images", [r.get("image")])] for r in rows]
    pq.write_table(pa.table({"images": blobs, "text": [r["text"] for r in rows]}), tmp_path / "caps.parquet")
    shards = ingested(tmp_path / "caps.parquet", tmp_path, bpe_tokenizer, "caption")
    assert_same_batches(loader(shards), loader(ImageTextFileReader(tmp_path / "caps.parquet", bpe_tokenizer)))
    dataset = datasets.Dataset.from_dict({"images": [[str(tmp_path / p) for p in r.get("images", [r.get("image")])]
                                                     for r in rows], "text": [r["text"] for r in rows]})
    dataset = dataset.cast_column("images", datasets.Sequence(datasets.Image()))
    on_disk = ingested(dataset, tmp_path, bpe_tokenizer, "caption", name="from-dataset")
    reader = ImageTextDatasetReader(dataset, tokenizer=bpe_tokenizer)
    assert reader.describe(0) == "the datasets.Dataset row 0"
    assert_same_batches(loader(on_disk), loader(reader))
    embedded = datasets.Dataset.from_dict({"images": [[{"bytes": b, "path": None} for b in row] for row in blobs],
                                           "text": [r["text"] for r in rows]})  # Image() cells holding bytes
    embedded = embedded.cast_column("images", datasets.Sequence(datasets.Image()))
    assert_same_batches(loader(on_disk), loader(ImageTextDatasetReader(embedded, tokenizer=bpe_tokenizer)))


def test_a_bad_row_raises_naming_the_file_and_row(images: list[str], bpe_tokenizer: Path, tmp_path: Path) -> None:
    rows = conversation_rows(images)
    rows[5]["conversations"][0]["value"] += " <image>"  # two placeholders for one image
    source = write_jsonl(tmp_path / "chat.jsonl", rows)
    with pytest.raises(ValueError, match=r"chat\.jsonl row 5: 2 <image> placeholder\(s\) for 1 image\(s\).*"
                                         r"on_error='skip'"):
        ImageTextFileReader(source, bpe_tokenizer, "conversations")
    rows = caption_rows(images)
    rows[3]["image"] = "img/missing.png"
    with pytest.raises(ValueError, match=r"caps\.jsonl row 3: image 0 \(img/missing\.png\): no such file"):
        ImageTextFileReader(write_jsonl(tmp_path / "caps.jsonl", rows), bpe_tokenizer)


def test_skip_leaves_bad_rows_out_as_ingest_does(images: list[str], bpe_tokenizer: Path, tmp_path: Path) -> None:
    rows = caption_rows(images)
    rows[2]["images"][1] = "img/missing.png"  # a bad second image: the whole row goes
    rows[6]["text"] = ""
    (tmp_path / "img" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not a png")
    rows[9]["image"] = "img/bad.png"
    source = write_jsonl(tmp_path / "caps.jsonl", rows)
    shards = ingested(source, tmp_path, bpe_tokenizer, "caption", on_error="skip")
    reader = ImageTextFileReader(source, bpe_tokenizer, on_error="skip")
    assert len(reader) == len(rows) - 3
    assert [r["path"] for r in reader.rejected] == ["caps.jsonl:2", "caps.jsonl:6", "caps.jsonl:9"]
    assert "img/missing.png" in reader.rejected[0]["reason"]
    assert_same_batches(loader(shards), loader(reader))


def test_images_are_read_when_a_batch_needs_them(images: list[str], bpe_tokenizer: Path, tmp_path: Path) -> None:
    rows = [{"image": images[0], "text": "a red circle"}, {"image": images[1], "text": "a blue square"}]
    source = write_jsonl(tmp_path / "caps.jsonl", rows)
    reader = ImageTextFileReader(source, bpe_tokenizer)
    assert reader.image_sizes().tolist() == [list(Image.open(tmp_path / p).size[::-1]) for p in images[:2]]
    (tmp_path / images[0]).write_bytes(png(100))  # changed after the reader opened: a batch reads it now
    assert bytes(reader.read(0)["images"][0]) == png(100)
    (tmp_path / images[1]).unlink()
    with pytest.raises(ImageProblem, match=r"caps\.jsonl row 1: image 0 \(img/1\.png\): no such file.*changed since"):
        reader.read(1)


def test_the_reader_pickles_as_how_to_open_it(images: list[str], bpe_tokenizer: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "chat.jsonl", conversation_rows(images))
    reader = ImageTextFileReader(source, bpe_tokenizer, "conversations")
    again = pickle.loads(pickle.dumps(reader))
    assert again.fingerprint() == reader.fingerprint() and len(again) == len(reader)
    for i in range(len(reader)):
        a, b = reader.read(i), again.read(i)
        assert all(np.array_equal(a[k], b[k]) for k in ("tokens", "image_at", "assistant"))
        assert [bytes(x) for x in a["images"]] == [bytes(x) for x in b["images"]]


def test_refusals_name_the_other_reader(bpe_tokenizer: Path, tmp_path: Path) -> None:
    import datasets

    dataset = datasets.Dataset.from_dict({"image": ["x.png"], "text": ["a"]})
    with pytest.raises(TypeError, match="ImageTextDatasetReader"):
        ImageTextFileReader(dataset, bpe_tokenizer)
    with pytest.raises(TypeError, match="ImageTextFileReader"):
        ImageTextDatasetReader(tmp_path / "caps.jsonl", bpe_tokenizer)
    with pytest.raises(TypeError, match=r"DatasetDict: pass one split"):
        ImageTextDatasetReader(datasets.DatasetDict({"train": dataset}), bpe_tokenizer)
    with pytest.raises(ValueError, match="on_error must be"):
        ImageTextDatasetReader(dataset, bpe_tokenizer, on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--layout must be one of"):
        ImageTextDatasetReader(dataset, bpe_tokenizer, layout="pairs")  # type: ignore[arg-type]


def test_a_bare_path_or_dataset_of_image_text_rows_names_the_reader_that_reads_them(images: list[str],
                                                                                   tmp_path: Path) -> None:
    import datasets

    packing = Packing(seq_len=64, image_tokens=N, image_token_id=ID)
    source = write_jsonl(tmp_path / "caps.jsonl", caption_rows(images, 2))
    with pytest.raises(ValueError, match=r"caps\.jsonl holds image-text rows .*stallfree\.ImageTextFileReader\("
                                         r".*layout='caption'"):
        Loader(source, 2, packing=packing)
    (tmp_path / "llava.json").write_text(json.dumps(conversation_rows(images, 2)))
    with pytest.raises(ValueError, match=r"llava\.json holds image-text rows .*layout='conversations'"):
        Loader(tmp_path / "llava.json", 2, packing=packing)
    dataset = datasets.Dataset.from_dict({"images": [[str(tmp_path / images[0])]], "messages": ["hi"]})
    with pytest.raises(ValueError, match=r"ImageTextDatasetReader\(dataset, .*conversations_field='messages'"):
        Loader(dataset, 2, packing=packing)


def test_a_state_resumes_mid_epoch_on_a_reopened_reader(images: list[str], bpe_tokenizer: Path,
                                                        tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "caps.jsonl", caption_rows(images, 20))
    reader = ImageTextFileReader(source, bpe_tokenizer)
    whole = list(loader(reader))
    first = loader(reader)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = loader(ImageTextFileReader(source, bpe_tokenizer))
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 2 >= 1
    for a, b in zip(rest, whole[2:], strict=True):
        assert all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in FIELDS if k != "columns")
    other = loader(ImageTextFileReader(source, bpe_tokenizer, add_eos="</s>"))  # other ids: other documents
    with pytest.raises(ValueError, match=r"Loader state has source=.* but this Loader has source="):
        other.load_state_dict(state)


def test_an_in_place_reader_mixes_with_text_as_its_shards_do(images: list[str], bpe_tokenizer: Path,
                                                             token_docs: Any, tmp_path: Path) -> None:
    from stallfree import Mix

    source = write_jsonl(tmp_path / "caps.jsonl", caption_rows(images, 12))
    shards = ingested(source, tmp_path, bpe_tokenizer, "caption")
    text = token_docs(np.random.default_rng(4).integers(1, 20, 12))
    weights = {"vl": 1, "text": 1}
    one = loader(Mix({"vl": shards, "text": text}, weights=weights), seq=64, columns=())
    two = loader(Mix({"vl": ImageTextFileReader(source, bpe_tokenizer), "text": text}, weights=weights), seq=64,
                 columns=())
    assert assert_same_batches(one, two) > 0
    assert all(torch.equal(a["dataset"], b["dataset"]) for a, b in zip(one, two, strict=True))
