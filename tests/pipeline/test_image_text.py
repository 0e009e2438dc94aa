"""Image-text samples in the Loader (issue 47, items 2 and 4): packs with each image's tokens, pixels from the graph."""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader, Packing
from stallfree.pipeline.image_text_reader import ImageTextShardReader
from stallfree.pipeline.samples import BadSampleError
from stallfree.transforms import Normalize, RandomHorizontalFlip, Resize
from tests.conftest import image_text_documents

N, ID = 4, 999  # tokens per image, the image token id (no text id: those are 1000 * i + t)
SPEC = [Resize((8, 8)), RandomHorizontalFlip(), Normalize()]


def loader(folder: Path, batch: int = 2, seq: int = 40, **kw: Any) -> Loader:
    packing = kw.pop("packing", None) or Packing(seq_len=seq, window=kw.pop("window", 8), image_tokens=N,
                                                 image_token_id=ID, train_on=kw.pop("train_on", "all"))
    return Loader(folder, batch, transform=kw.pop("transform", SPEC), packing=packing, shuffle=True, seed=3,
                  num_threads=1, **kw)


def expected_row(doc: Any, train_on: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """A document's positions (ids) and targets, built here from its fields alone."""
    ids: list[int] = []
    targets: list[bool] = []
    at = list(doc.image_at)
    for t in range(len(doc.tokens) + 1):
        while at and at[0] == t:
            ids += [ID] * N
            targets += [False] * N
            at.pop(0)
        if t < len(doc.tokens):
            ids.append(int(doc.tokens[t]))
            targets.append(train_on == "all" or bool(doc.assistant[t]))
    return np.asarray(ids), np.asarray(targets)


def check_batch(batch: dict[str, Any], docs: list[Any], train_on: str = "all") -> list[tuple[int, int]]:
    """Every field agrees with the documents; returns the batch's images as (document, image) in pixel order."""
    ids, labels, docs_at = batch["input_ids"].numpy(), batch["labels"].numpy(), batch["document_index"].numpy()
    positions = batch["position_ids"].numpy()
    images: list[tuple[int, int]] = []
    for r in range(ids.shape[0]):
        col = 0
        while col < ids.shape[1]:
            row = int(docs_at[r, col])
            if row < 0:  # padding (or a skipped document's positions)
                assert labels[r, col] == -100
                col += 1
                continue
            want, targets = expected_row(docs[row], train_on)
            span = slice(col, col + len(want))
            assert (ids[r, span] == want).all(), f"row {r}: document {row}'s positions"
            assert (positions[r, span] == np.arange(len(want))).all()
            assert labels[r, col] == -100, "a document's first position is not predicted"
            got = labels[r, col + 1 : span.stop]
            assert (got == np.where(targets[1:], want[1:], -100)).all(), f"row {r}: document {row}'s labels"
            images += [(row, j) for j in range(len(docs[row].images))]
            col = span.stop
    assert batch["image_document_index"].tolist() == [row for row, _ in images]
    assert batch["pixel_values"].shape == (len(images), 3, 8, 8)
    assert int((batch["input_ids"] == ID).sum()) == N * len(images)
    return images


def pixels_by_image(loaders: list[Loader]) -> dict[tuple[int, int], torch.Tensor]:
    out: dict[tuple[int, int], torch.Tensor] = {}
    docs = None
    for each in loaders:
        for batch in each:
            docs = docs or image_text_documents(len(each.reader))
            for key, px in zip(check_batch(batch, docs), batch["pixel_values"], strict=True):
                assert key not in out, f"image {key} delivered twice in an epoch"
                out[key] = px
    return out


def test_a_batch_holds_each_images_tokens_where_it_goes_and_its_pixels(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(30)
    docs = image_text_documents(30)
    each = loader(folder)
    batches = list(each)
    assert len(batches) == len(each) >= 3
    seen = Counter(row for b in batches for row in set(b["document_index"].flatten().tolist()) if row >= 0)
    assert set(seen) == set(range(30)) and set(seen.values()) == {1}, "every document once in an epoch"
    for batch in batches:
        check_batch(batch, docs)
        assert batch["cu_seqlens"][-1] == batch["input_ids"].numel()
    assert sum(len(b["pixel_values"]) for b in batches) == sum(len(d.images) for d in docs)


def test_train_on_assistant_labels_only_the_marked_tokens(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(12)
    docs = image_text_documents(12)
    for batch in loader(folder, train_on="assistant"):
        check_batch(batch, docs, "assistant")


def test_an_images_pixels_are_the_same_whichever_rank_pack_or_position(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(24)
    one = pixels_by_image([loader(folder)])
    two = pixels_by_image([loader(folder, batch=1, seq=48, window=3, rank=r, world_size=2) for r in range(2)])
    every = {(i, j) for i, d in enumerate(image_text_documents(24)) for j in range(len(d.images))}
    assert set(one) == set(two) == every
    assert all(torch.equal(one[key], two[key]) for key in one)
    flipped = [key for key in one if not torch.equal(one[key], one[key].flip(-1))]
    assert flipped, "the images are not symmetric: a flip would show"


def test_pixels_are_the_image_transforms_output(image_text_shards: Callable[..., Path], tmp_path: Path) -> None:
    folder = image_text_shards(10)
    docs = image_text_documents(10)
    spec = [Resize((8, 8)), Normalize()]
    got = pixels_by_image([loader(folder, transform=spec)])
    files = []
    for (i, j) in sorted(got):
        path = tmp_path / "c" / f"{i}_{j}.png"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(docs[i].images[j])
        files.append(path)
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\n" + "".join(f"{p.relative_to(tmp_path)},0\n" for p in files))
    images = torch.cat([x for x, _ in Loader(listing, 4, transform=spec, num_threads=1)])
    assert torch.equal(torch.stack([got[key] for key in sorted(got)]), images), "the image samples' graph and spec"


def test_ranks_get_equal_batch_counts_and_every_document_once(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(31)
    per_rank = [list(loader(folder, batch=2, rank=r, world_size=3)) for r in range(3)]
    assert len({len(b) for b in per_rank}) == 1
    rows = Counter(row for batches in per_rank for b in batches for row in set(b["document_index"].flatten().tolist())
                   if row >= 0)
    assert set(rows) == set(range(31)) and set(rows.values()) == {1}


def test_an_elastic_resume_delivers_the_rest_once(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(40)
    before: list[int] = []
    states = []
    for r in range(2):
        each = loader(folder, batch=1, rank=r, world_size=2)
        it = iter(each)
        for _ in range(3):
            before += [row for row in set(next(it)["document_index"].flatten().tolist()) if row >= 0]
        states.append(json.loads(json.dumps(each.state_dict())))
    after: list[int] = []
    for r in range(3):
        each = loader(folder, batch=1, rank=r, world_size=3)
        each.load_state_dict(states[0])
        after += [row for b in each for row in set(b["document_index"].flatten().tolist()) if row >= 0]
    assert sorted(before + after) == list(range(40))


def test_reader_reads_the_shard_fields_without_a_copy(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(6, shard_mb=0.0001)
    reader = ImageTextShardReader(folder)
    docs = image_text_documents(6)
    assert reader.image_counts().tolist() == [len(d.images) for d in docs]
    assert reader.lengths().tolist() == [len(d.tokens) for d in docs]
    for i, doc in enumerate(docs):
        sample = reader.read(i)
        assert sample["tokens"].tolist() == doc.tokens.tolist()
        assert [bytes(b) for b in sample["images"]] == doc.images
        assert sample["image_at"].tolist() == list(doc.image_at)
        assert sample["assistant"].tolist() == doc.assistant.tolist()
    assert len(reader.shard_rows()) > 1


BROKEN = b"\x89PNG\r\n\x1a\n not an image at all"


def _corrupt_png() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 30, 3), np.uint8)).save(out, "PNG")
    data = bytearray(out.getvalue())
    at = data.index(b"IDAT") + 14
    data[at : at + 50] = bytes(b ^ 0x5A for b in data[at : at + 50])  # the header reads; decoding fails in the graph
    return bytes(data)


@pytest.mark.parametrize("chunk", [64, 1], ids=["one-chunk", "image-by-image"])
@pytest.mark.parametrize("bad", [BROKEN, _corrupt_png()], ids=["header", "graph"])
def test_a_document_whose_image_fails_is_skipped_whole(image_text_shards: Callable[..., Path], bad: bytes,
                                                       chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # image by image, the document's first image has passed the graph when its second fails: it is taken out again
    monkeypatch.setattr("stallfree.pipeline.image_text_run.IMAGE_CHUNK", chunk)
    docs = image_text_documents(20)
    broken = next(i for i, d in enumerate(docs) if len(d.images) == 2)
    folder = image_text_shards(20, broken={broken: bad})
    with pytest.raises(BadSampleError, match=rf"row {broken} \(generated.jsonl:{broken}\)"):
        list(loader(folder))
    clean = loader(image_text_shards(20))
    each = loader(folder, on_error="skip")
    batches = list(each)
    assert len(batches) == len(clean)
    rows = {row for b in batches for row in b["document_index"].flatten().tolist() if row >= 0}
    assert rows == set(range(20)) - {broken}, "the document is left out whole, its text too"
    for batch in batches:
        assert broken not in batch["image_document_index"].tolist()
        check_batch(batch, docs)
    assert [(s["index"], s["document"]) for s in each.skipped] == [(broken, True)]
    assert ("decoding failed" in each.skipped[0]["reason"]) == (bad != BROKEN), "where it failed: header or graph"
    # its pack was delivered without it: a state taken after it resumes exactly, on these ranks or on others
    at = each.skipped[0]["position"] // 2  # the batch holding its pack
    reference = [b["input_ids"] for b in loader(folder, on_error="skip")]
    first = loader(folder, on_error="skip")
    it = iter(first)
    for _ in range(at + 1):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert [(s["index"], s["document"]) for s in state["skipped"]] == [(broken, True)]
    resumed = loader(folder, on_error="skip")
    resumed.load_state_dict(state)
    rest = [b["input_ids"] for b in resumed]
    assert len(rest) == len(reference) - at - 1
    assert all(torch.equal(a, b) for a, b in zip(rest, reference[at + 1 :], strict=True))
    elastic = loader(folder, on_error="skip", rank=0, world_size=2)
    elastic.load_state_dict(state)  # not refused: no position was passed over
    list(elastic)


def test_refusals_name_what_is_wrong(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(8)
    with pytest.raises(ValueError, match="image_tokens=N, image_token_id=ID"):
        Loader(folder, 2, transform=SPEC, packing=Packing(seq_len=40))
    with pytest.raises(ValueError, match="are packed: pass packing="):
        Loader(folder, 2, transform=SPEC)
    with pytest.raises(ValueError, match="must give every sample the same size"):
        Loader(folder, 2, transform=[Normalize()], packing=Packing(seq_len=40, image_tokens=N, image_token_id=ID))
    with pytest.raises(ValueError, match=r"row \d+\) takes \d+ positions .* more than seq_len=12"):
        Loader(folder, 2, transform=SPEC, packing=Packing(seq_len=12, image_tokens=N, image_token_id=ID))
    with pytest.raises(ValueError, match="image_tokens and image_token_id go together"):
        Packing(seq_len=12, image_tokens=N)


def test_image_tokens_may_be_a_function_of_the_transformed_size(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(8)
    packing = Packing(seq_len=40, window=8, image_tokens=lambda h, w: (h // 4) * (w // 4), image_token_id=ID)
    for batch in loader(folder, packing=packing):
        assert int((batch["input_ids"] == ID).sum()) == N * len(batch["pixel_values"])  # (8 / 4) * (8 / 4) = 4


def test_a_mix_packs_image_text_and_text_documents_together(image_text_shards: Callable[..., Path],
                                                            token_docs: Callable[..., Any]) -> None:
    from stallfree import Mix

    folder = image_text_shards(20)
    docs = image_text_documents(20)
    text = token_docs(np.random.default_rng(4).integers(1, 20, 20))
    each = loader(Mix({"text": text, "vl": folder}, weights={"text": 1, "vl": 1}), seq=48)
    shared = images = 0
    for batch in each:
        dataset, rows = batch["dataset"], batch["document_index"]
        shared += sum(1 for r in range(len(dataset)) if {0, 1} <= set(dataset[r].tolist()))
        at_images = (batch["input_ids"] == ID) & (dataset == 1)
        owners = rows[at_images].reshape(-1, N)[:, 0]  # each image's N positions, row-major: its document
        assert batch["image_document_index"].tolist() == owners.tolist(), "the image-text source's own rows"
        vl_rows = {int(r) for r in rows[dataset == 1].unique()}
        assert len(batch["pixel_values"]) == sum(len(docs[r].images) for r in vl_rows)
        images += len(batch["pixel_values"])
    assert shared, "image and text-only documents share packs"
    assert images == sum(len(d.images) for d in docs), "every image of the epoch's image-text documents"


def test_a_compute_balance_counts_each_image_at_cost_image(image_text_shards: Callable[..., Path]) -> None:
    from stallfree import Cost

    folder = image_text_shards(30)
    docs = image_text_documents(30)
    cost = Cost(1.0, image=50.0)
    each = loader(folder, packing=Packing(seq_len=40, window=8, image_tokens=N, image_token_id=ID, balance="compute",
                                          cost=cost, microbatches=2))
    planned = each.sampler.plan(0).balance.costs
    delivered = []
    for batch in each:
        units = []
        for r in range(len(batch["input_ids"])):
            rows = batch["document_index"][r]
            units.append(sum(cost.document(int((rows == d).sum()), len(docs[d].images))
                             for d in set(rows.tolist()) - {-1}))
        delivered.append(units)
    assert np.allclose(planned, np.asarray(delivered)), "the plan's costs are the batches' with their images"


def test_train_on_assistant_is_refused_for_tokens_that_mark_none(token_docs: Callable[..., Any]) -> None:
    with pytest.raises(ValueError, match="train_on='assistant'.* marks none"):
        Loader(token_docs([5, 6, 7]), 2, packing=Packing(seq_len=16, train_on="assistant"))


@pytest.mark.gpu
@pytest.mark.parametrize("placement", ["gpu", "cpu"])
def test_pixels_on_cuda_match_the_cpu_graph(image_text_shards: Callable[..., Path], placement: str) -> None:
    folder = image_text_shards(16)
    spec = [Resize((8, 8)), RandomHorizontalFlip()]
    cpu = list(loader(folder, transform=spec, dtype="uint8"))
    cuda = list(loader(folder, transform=spec, dtype="uint8", device="cuda", placement=placement))
    assert len(cpu) == len(cuda)
    for a, b in zip(cpu, cuda, strict=True):
        assert b["pixel_values"].device.type == "cuda" and b["input_ids"].device.type == "cuda"
        assert torch.equal(a["input_ids"], b["input_ids"].cpu())
        assert torch.equal(a["image_document_index"], b["image_document_index"].cpu())
        if len(a["pixel_values"]):  # the same flips; resizing on the GPU may round otherwise
            assert (a["pixel_values"].int() - b["pixel_values"].cpu().int()).abs().float().mean() < 2.0


def test_image_text_shards_at_a_url_give_the_local_batches(image_text_shards: Callable[..., Path],
                                                            tmp_path: Path) -> None:
    from stallfree.bench.servers import RangeServer

    folder = image_text_shards(20, shard_mb=0.002)
    local = list(loader(folder))
    with RangeServer(folder) as server:
        remote = loader(server.url, cache_dir=tmp_path / "cache")
        assert type(remote.reader).__name__ == "RemoteImageTextShardReader"
        assert remote.reader.image_counts().tolist() == ImageTextShardReader(folder).image_counts().tolist()
        batches = list(remote)
        again = loader(server.url, cache_dir=tmp_path / "cache")
        it = iter(again)
        next(it)
        state = json.loads(json.dumps(again.state_dict()))
    assert len(batches) == len(local)
    for a, b in zip(local, batches, strict=True):
        assert [k for k in a if not torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k]))] == []
    resumed = loader(folder)
    resumed.load_state_dict(state)  # a state moves between the URL and the folder
    rest = list(resumed)
    assert len(rest) == len(local) - 1
    assert all(torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(rest, local[1:], strict=True))


def test_an_ingested_llava_conversation_trains_on_the_replies_with_its_image_at_the_placeholder(
        bpe_tokenizer: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text

    Image.fromarray(np.full((12, 16, 3), 200, np.uint8)).save(tmp_path / "a.png")
    rows = [{"image": "a.png", "conversations": [{"from": "human", "value": f"What is here? <image> ({i})"},
                                                 {"from": "gpt", "value": "a grey square" * (1 + i % 2)}]}
            for i in range(6)]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ingest_image_text(tmp_path / "chat.jsonl", tmp_path / "vl",
                      ImageTextOptions(layout="conversations", tokenizer=str(bpe_tokenizer)))
    reader = ImageTextShardReader(tmp_path / "vl")
    vocab = Tokenizer.from_file(str(bpe_tokenizer))
    image_id = vocab.get_vocab_size()  # an id past the text's
    each = Loader(tmp_path / "vl", 2, transform=[Resize((8, 8)), Normalize()], seed=0, num_threads=1,
                  packing=Packing(seq_len=256, image_tokens=N, image_token_id=image_id, train_on="assistant"))
    for batch in each:
        ids, labels = batch["input_ids"], batch["labels"]
        for r in range(len(ids)):
            for row in set(batch["document_index"][r].tolist()) - {-1}:
                mine = batch["document_index"][r] == row
                doc = reader.read(row)
                cut = int(doc["image_at"][0])  # the placeholder's token position
                row_ids = ids[r][mine]
                assert row_ids[cut : cut + N].tolist() == [image_id] * N
                targets = vocab.decode(labels[r][mine][labels[r][mine] != -100].tolist())
                assert "grey square" in targets and "What is here" not in targets
        assert len(batch["pixel_values"]) == int((ids == image_id).sum()) // N


def test_a_state_is_refused_where_image_tokens_gives_another_count(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(8)

    def make(per: int) -> Loader:
        return loader(folder, packing=Packing(seq_len=60, window=8, image_tokens=lambda h, w: per,
                                              image_token_id=ID))

    state = make(4).state_dict()
    make(4).load_state_dict(state)
    with pytest.raises(ValueError, match="image_tokens"):
        make(5).load_state_dict(state)


def test_pixels_do_not_depend_on_the_graphs_chunk(image_text_shards: Callable[..., Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = image_text_shards(16)
    whole = list(loader(folder, batch=4))
    monkeypatch.setattr("stallfree.pipeline.image_text_run.IMAGE_CHUNK", 3)  # a batch's images in several runs
    chunked = list(loader(folder, batch=4))
    assert any(len(b["pixel_values"]) > 3 for b in whole)
    assert all(torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(whole, chunked, strict=True))


def test_columns_name_each_document_of_a_batch(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(10)
    docs = image_text_documents(10)
    for batch in loader(folder, columns=["source", "image_count", "index"]):
        rows = batch["columns"]["index"].tolist()
        starts = (batch["position_ids"] == 0) & (batch["document_index"] >= 0)
        assert rows == batch["document_index"][starts].tolist(), "one entry per document, in the order of its segment"
        assert batch["columns"]["source"] == [docs[r].source for r in rows]
        assert batch["columns"]["image_count"].tolist() == [len(docs[r].images) for r in rows]


def test_an_echoed_document_has_its_images_drawn_afresh(image_text_shards: Callable[..., Path]) -> None:
    folder = image_text_shards(12)
    docs = image_text_documents(12)
    once = pixels_by_image([loader(folder)])
    seen: dict[tuple[int, int], list[torch.Tensor]] = {}
    for batch in loader(folder, echo=2):
        for key, px in zip(_keys(batch, docs), batch["pixel_values"], strict=True):
            seen.setdefault(key, []).append(px)
    assert set(seen) == set(once) and all(len(v) == 2 for v in seen.values()), "each image twice"
    assert all(any(torch.equal(once[key], px) for px in seen[key]) for key in once), "its first time's pixels"
    assert any(not torch.equal(a, b) for a, b in seen.values()), "the repeat is augmented afresh"


def _keys(batch: dict[str, Any], docs: list[Any]) -> list[tuple[int, int]]:
    """Each image of a batch as (document, image), in pixel order (a document's images are consecutive)."""
    keys: list[tuple[int, int]] = []
    for row in batch["image_document_index"].tolist():
        j = 0 if not keys or keys[-1][0] != row or keys[-1][1] + 1 >= len(docs[row].images) else keys[-1][1] + 1
        keys.append((row, j))
    return keys
