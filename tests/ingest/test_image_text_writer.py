"""The image-text shard writer: what ``write_image_text_shards`` writes is what the contract's shard holds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stallfree.ingest.image_text_writer import ImageTextDocument, write_image_text_shards
from stallfree.ingest.manifest import read_manifest


def _document(encode, seed: int, words: int, images: int) -> ImageTextDocument:
    tokens = np.arange(seed, seed + words) % 300
    sizes = [(10 + i, 12 + i) for i in range(images)]
    return ImageTextDocument(tokens=tokens, images=[encode(seed * 10 + i, size) for i, size in enumerate(sizes)],
                             image_at=[min(i * 2, words) for i in range(images)], image_sizes=sizes,
                             assistant=(np.arange(words) % 2).astype(np.uint8), source=f"gen.jsonl:{seed}")


def test_the_shards_hold_each_documents_columns_in_order(encode, shard_rows, tmp_path):
    documents = [_document(encode, s, 3 + s, s % 3) for s in range(40)]
    manifest = write_image_text_shards(tmp_path / "out", documents, vocab_size=300, layout="conversations",
                                       shard_mb=0.005)
    rows = shard_rows(tmp_path / "out")
    assert len(manifest["shards"]) > 1
    assert [r["tokens"] for r in rows] == [d.tokens.tolist() for d in documents]
    assert [r["length"] for r in rows] == [len(d.tokens) for d in documents]
    assert [r["images"] for r in rows] == [d.images for d in documents]
    assert [r["image_at"] for r in rows] == [d.image_at for d in documents]
    assert [r["image_sizes"] for r in rows] == [[v for s in d.image_sizes for v in s] for d in documents]
    assert [r["assistant"] for r in rows] == [d.assistant.tolist() for d in documents]
    assert [r["source"] for r in rows] == [d.source for d in documents]
    assert manifest == read_manifest(tmp_path / "out")  # passes the one manifest check
    assert manifest["kind"] == "image_text" and manifest["layout"] == "conversations"
    assert manifest["token_dtype"] == "uint16" and manifest["images"] == sum(len(d.images) for d in documents)
    assert manifest["image_placeholder"] == "<image>"
    lengths = np.load(tmp_path / "out" / manifest["lengths"]["file"])
    counts = np.load(tmp_path / "out" / manifest["image_counts"]["file"])
    assert lengths.dtype == counts.dtype == np.int32
    assert lengths.tolist() == [len(d.tokens) for d in documents]
    assert counts.tolist() == [len(d.images) for d in documents]


def test_ids_beyond_uint16_are_written_as_int32(encode, tmp_path):
    document = _document(encode, 0, 4, 1)
    big = ImageTextDocument(np.array([70_000, 1, 2]), document.images, [0], document.image_sizes,
                            np.ones(3, np.uint8), "a:0")
    manifest = write_image_text_shards(tmp_path / "out", [big])
    assert manifest["token_dtype"] == "int32" and manifest["vocab_size"] is None


@pytest.mark.parametrize(("change", "message"), [
    ({"image_at": [5]}, r"image_at \[5\] must be non-decreasing positions in 0..4"),
    ({"image_sizes": []}, r"1 image\(s\) but 1 image_at and 0 image_sizes"),
    ({"assistant": np.ones(3, np.uint8)}, r"assistant must hold one 0 or 1 per token \(4\)"),
    ({"tokens": np.array([], np.int64), "assistant": np.ones(0, np.uint8), "image_at": [0]}, "empty document"),
    ({"tokens": np.array([1, 2, 3, 300])}, r"token id 300 is beyond the vocabulary \(vocab_size 300\)"),
])
def test_a_document_whose_parts_disagree_is_refused_by_its_source(change, message, encode, tmp_path):
    fields = dict(vars(_document(encode, 7, 4, 1)))
    fields.update(change)
    with pytest.raises(ValueError, match=rf"document gen.jsonl:7: {message}"):
        write_image_text_shards(tmp_path / "out", [ImageTextDocument(**fields)], vocab_size=300)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_damaged_image_text_manifest_is_refused_by_field(encode, tmp_path):
    write_image_text_shards(tmp_path / "out", [_document(encode, 1, 4, 1)])
    path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["image_counts"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="image_counts must be an object"):
        read_manifest(tmp_path / "out")


def test_verify_finds_image_counts_that_disagree_with_the_shards(encode, tmp_path):
    from stallfree.ingest.labels import save_labels
    from stallfree.ingest.manifest import write_manifest
    from stallfree.ingest.verify import verify

    write_image_text_shards(tmp_path / "out", [_document(encode, s, 4, s % 3) for s in range(4)])
    assert verify(tmp_path / "out", decode=True) == []
    manifest = read_manifest(tmp_path / "out")
    manifest["image_counts"] = save_labels(tmp_path / "out", np.array([0, 1, 2, 2], np.int32), "image_counts.npy")
    write_manifest(tmp_path / "out" / "manifest.json", manifest)  # listed, but wrong in its last row
    assert verify(tmp_path / "out") == ["image_counts.npy: rows 0..3 differ from shard-00000.arrow's image counts "
                                        "(ingest again)"]
