"""Token readers: ingested token shards, Parquet/JSON Lines and Hugging Face datasets in place, and their routing."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallfree.ingest.fields import TOKEN_FIELDS
from stallfree.ingest.token_runner import ingest_tokens
from stallfree.ingest.token_writer import TokenOptions
from stallfree.pipeline.readers import FileListReader, FolderReader, open_source
from stallfree.pipeline.shards import ShardReader
from stallfree.pipeline.token_readers import HuggingFaceTokenReader, TokenFileReader, TokenShardReader

#: Documents of varied lengths (1 to 40 ids), with ids up to 999.
DOCUMENTS = [[int(v) for v in np.random.default_rng(i).integers(0, 1000, 1 + (i * 7) % 40)] for i in range(50)]


def in_arrow_buffer(ids: np.ndarray) -> bool:
    """Whether ``ids`` is a view into a pyarrow Buffer (no copy out of Arrow)."""
    base = ids
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if not isinstance(base, pa.Buffer):
        return False
    start = ids.__array_interface__["data"][0]
    return base.address <= start and start + ids.nbytes <= base.address + base.size


@pytest.fixture(scope="module")
def token_shards(texts: list[str], bpe_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("src") / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path_factory.mktemp("shards")
    ingest_tokens(source, out, TokenOptions(tokenizer=str(bpe_tokenizer), shard_mb=0.002))
    return out


def expect_reader(reader, documents: list[list[int]]) -> None:
    """What every token reader answers: its fields, rows, lengths, zero labels, the Reader checks, pickling."""
    reader.check()
    assert reader.fields == TOKEN_FIELDS and reader.encoded is False and reader.classes == []
    assert len(reader) == len(documents)
    assert [reader.read(i)["tokens"].tolist() for i in range(len(reader))] == documents
    assert reader.lengths().dtype == np.int64 and reader.lengths().tolist() == [len(d) for d in documents]
    assert reader.labels().tolist() == [0] * len(documents)
    assert all(np.array_equal(reader.read_tokens(i), reader.read(i)["tokens"]) for i in range(len(reader)))
    copy = pickle.loads(pickle.dumps(reader))  # reopened, not copied
    assert type(copy) is type(reader) and copy.fingerprint() == reader.fingerprint()
    assert [copy.read_tokens(i).tolist() for i in range(len(copy))] == documents


def test_token_shards_read_what_ingest_wrote(token_shards, texts, bpe_tokenizer, tmp_path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bpe_tokenizer))
    reader = TokenShardReader(token_shards)
    expect_reader(reader, [tokenizer.encode(t).ids for t in texts])
    assert reader.vocab_size == 300 and reader.token_dtype == np.uint16
    assert reader.read_tokens(3).dtype == np.uint16 and in_arrow_buffer(reader.read_tokens(3))
    assert reader.describe(2) == f"{token_shards}/shard-00000.arrow row 2 (docs.jsonl:2)"
    assert reader.columns == ["length", "source"] and len(reader.shard_rows()) > 1
    assert reader.column("length", np.array([5, 1])).tolist() == [len(tokenizer.encode(texts[i]).ids) for i in (5, 1)]
    assert reader.column("source", np.array([7])) == ["docs.jsonl:7"]
    copied = tmp_path / "copy"
    shutil.copytree(token_shards, copied)
    assert TokenShardReader(copied).fingerprint() == reader.fingerprint()  # the data, wherever it lies


def test_each_shard_reader_refuses_the_other_kind(token_shards, image_folder, tmp_path):
    from stallfree.ingest.runner import ingest

    with pytest.raises(ValueError, match="holds tokens, not images: open it with TokenShardReader"):
        ShardReader(token_shards)
    ingest(image_folder, tmp_path / "images")
    with pytest.raises(ValueError, match="holds images, not tokens: open it with ShardReader"):
        TokenShardReader(tmp_path / "images")


def test_token_shards_at_a_url_give_the_local_folders_packs_and_resume(token_shards, tmp_path):
    """Token shards behind a real HTTP server on 127.0.0.1 (and at a file:// URL): the same packed batches as the
    folder on disk, and a state taken mid-epoch resumes on either. Before, a URL was read as image shards only
    (KeyError 'image')."""
    import torch

    from stallfree import Loader, Packing
    from stallfree.bench.servers import RangeServer

    def batches(source: object, state: dict | None = None, **remote: object) -> list[dict]:
        loader = Loader(source, batch_size=2, packing=Packing(seq_len=48, window=16), shuffle=True, seed=3,
                        **remote)
        if state is not None:
            loader.load_state_dict(state)
        return list(loader)

    def same(a: list[dict], b: list[dict]) -> None:
        assert len(a) == len(b) and len(a) > 2
        for x, y in zip(a, b, strict=True):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x if isinstance(x[k], torch.Tensor))

    local = batches(token_shards)
    with RangeServer(token_shards) as server:
        reader = open_source(server.url, remote={"cache_dir": tmp_path / "cache-a"})
        assert type(reader).__name__ == "RemoteTokenShardReader" and reader.fields == TOKEN_FIELDS
        assert reader.lengths().tolist() == TokenShardReader(token_shards).lengths().tolist()
        same(batches(server.url, cache_dir=tmp_path / "cache-b"), local)
        loader = Loader(server.url, batch_size=2, packing=Packing(seq_len=48, window=16), shuffle=True, seed=3,
                        cache_dir=tmp_path / "cache-c")
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    same(batches(f"file://{token_shards}", cache_dir=tmp_path / "cache-d"), local)
    same(batches(token_shards, state), local[2:])


def test_columns_name_each_document_piece_of_a_packed_batch(token_shards):
    """columns= on token shards: one value per document piece, in the order of the batch's segments (it was refused
    for tokens, though the issue asks that columns keep their meaning)."""
    from stallfree import Loader, Packing

    reader = TokenShardReader(token_shards)
    loader = Loader(token_shards, batch_size=2, packing=Packing(seq_len=48, window=16), shuffle=True, seed=1,
                    columns=["index", "source", "length"])
    pieces = 0
    for batch in loader:
        columns, documents = batch["columns"], batch["document_index"]
        starts = batch["cu_seqlens"][:-1].tolist()
        flat = documents.reshape(-1)
        real = [flat[start].item() for start in starts if flat[start].item() >= 0]  # each segment's document
        assert columns["index"].tolist() == real
        assert columns["source"] == [reader.column("source", [row])[0] for row in real]
        assert columns["length"].tolist() == reader.lengths()[real].tolist()
        pieces += len(real)
    assert pieces >= len(reader)
    for batch in Loader(token_shards, batch_size=3, columns=["index"]):  # padded: one per row
        assert batch["columns"]["index"].tolist() == batch["document_index"].tolist()


def test_an_altered_lengths_file_is_refused(token_shards, tmp_path):
    copied = tmp_path / "copy"
    shutil.copytree(token_shards, copied)
    lengths = np.load(copied / "lengths.npy")
    lengths[0] += 1
    np.save(copied / "lengths.npy", lengths)
    with pytest.raises(OSError, match="lengths.npy: SHA-256 differs from the manifest's"):
        TokenShardReader(copied)


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_file_of_token_ids_is_read_in_place(kind, tmp_path):
    path = tmp_path / f"ids.{kind}"
    if kind == "parquet":
        pq.write_table(pa.table({"input_ids": pa.array(DOCUMENTS, pa.list_(pa.int32()))}), path, row_group_size=7)
    else:
        path.write_text("".join(json.dumps({"tokens": d, "n": 1}) + "\n" for d in DOCUMENTS))
    reader = TokenFileReader(path)
    expect_reader(reader, DOCUMENTS)
    assert in_arrow_buffer(reader.read_tokens(9))  # no copy out of the Arrow table
    assert reader.describe(9) == f"ids.{kind} row 9" and reader.vocab_size is None


def test_a_folder_of_files_is_one_source_in_name_order(tmp_path):
    pq.write_table(pa.table({"input_ids": DOCUMENTS[20:]}), tmp_path / "b.parquet")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in DOCUMENTS[:20]))
    reader = TokenFileReader(tmp_path)
    expect_reader(reader, DOCUMENTS)
    assert reader.describe(19) == "a.jsonl row 19" and reader.describe(20) == "b.parquet row 0"


BAD = [([[1, 2], [], [3]], r"empty document \(no tokens\)"),
       ([[1, 2], [4, -5], [3]], "negative token id -5"),
       ([[1, 2], [4, 1000], [3]], r"token id 1000 is beyond the vocabulary \(vocab_size 1000\)"),
       ([[1, 2], [4, None], [3]], "a null token id"),
       ([[1, 2], None, [3]], r"missing \(null\)")]


@pytest.mark.parametrize(("documents", "reason"), BAD)
@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_a_bad_row_raises_naming_the_file_and_row(kind, documents, reason, tmp_path):
    path = tmp_path / f"ids.{kind}"
    if kind == "parquet":
        pq.write_table(pa.table({"input_ids": documents}), path)
    else:
        path.write_text("".join(json.dumps({"input_ids": d}) + "\n" for d in documents))
    with pytest.raises(ValueError, match=rf"{path} row 1: {reason}; fix it, or pass on_error='skip'"):
        TokenFileReader(path, vocab_size=1000)
    reader = TokenFileReader(path, vocab_size=1000, on_error="skip")
    assert [reader.read_tokens(i).tolist() for i in range(len(reader))] == [[1, 2], [3]]
    assert reader.lengths().tolist() == [2, 1] and reader.describe(1) == f"ids.{kind} row 2"
    assert len(reader.rejected) == 1 and reader.rejected[0]["path"] == f"ids.{kind}:1"
    assert pickle.loads(pickle.dumps(reader)).rejected == reader.rejected


def test_a_json_line_that_is_no_document_is_named_by_its_row(tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text('{"input_ids": [1]}\n\n{"input_ids": "1 2"}\n{oops\n{"input_ids": [2]}\n')
    reader = TokenFileReader(path, on_error="skip")
    assert [r["path"] for r in reader.rejected] == ["ids.jsonl:2", "ids.jsonl:3"]  # row 1 is a blank line
    assert [reader.describe(i) for i in range(len(reader))] == ["ids.jsonl row 0", "ids.jsonl row 4"]


def test_a_file_without_token_ids_is_refused_with_the_fix(tmp_path):
    pq.write_table(pa.table({"text": ["a"], "n": [1]}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match=r"no column of token ids .*\['text', 'n'\].*--tokenizer PATH"):
        TokenFileReader(tmp_path / "t.parquet")
    pq.write_table(pa.table({"input_ids": ["1 2"]}), tmp_path / "s.parquet")
    with pytest.raises(ValueError, match="column 'input_ids' is string, not a list of integer token ids"):
        TokenFileReader(tmp_path / "s.parquet", tokens_field="input_ids")


def test_a_hugging_face_dataset_is_read_without_a_copy(tmp_path):
    import datasets

    dataset = datasets.Dataset.from_dict({"input_ids": DOCUMENTS, "text": ["x"] * len(DOCUMENTS)})
    dataset.save_to_disk(str(tmp_path / "ds"))
    mapped = datasets.load_from_disk(str(tmp_path / "ds"))  # memory-mapped from its Arrow file
    reader = HuggingFaceTokenReader(mapped)
    expect_reader(reader, DOCUMENTS)
    column = mapped.data.table.column("input_ids").chunk(0)
    values = np.frombuffer(column.values.buffers()[1], column.values.type.to_pandas_dtype())
    assert all(np.shares_memory(reader.read_tokens(i), values) for i in range(len(reader)))
    shuffled = mapped.shuffle(seed=3)  # an indices mapping: read through it, in the dataset's own order
    assert [HuggingFaceTokenReader(shuffled).read_tokens(i).tolist() for i in range(5)] == shuffled["input_ids"][:5]


def test_a_hugging_face_dataset_with_bad_rows_or_splits(tmp_path):
    import datasets

    dataset = datasets.Dataset.from_dict({"input_ids": [[1], [-2], [3]]})
    with pytest.raises(ValueError, match=r"row 1: negative token id -2"):
        HuggingFaceTokenReader(dataset)
    assert len(HuggingFaceTokenReader(dataset, on_error="skip")) == 2
    with pytest.raises(TypeError, match=r"holds the splits \['train'\].* ds\['train'\]"):
        HuggingFaceTokenReader(datasets.DatasetDict({"train": dataset}))


def test_open_source_routes_token_sources_to_token_readers(token_shards, image_folder, indexed_list, tmp_path):
    import datasets

    from stallfree.ingest.runner import ingest

    pq.write_table(pa.table({"input_ids": DOCUMENTS}), tmp_path / "ids.parquet")
    (tmp_path / "ids.jsonl").write_text(json.dumps({"input_ids": [1, 2]}) + "\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copy(tmp_path / "ids.parquet", folder / "part-0.parquet")
    ingest(image_folder, tmp_path / "images")
    pq.write_table(pa.table({"path": ["a.png"], "label": [0]}), tmp_path / "list.parquet")
    assert type(open_source(token_shards)) is TokenShardReader
    assert type(open_source(token_shards / "manifest.json")) is TokenShardReader
    assert type(open_source(tmp_path / "ids.parquet")) is TokenFileReader
    assert type(open_source(str(tmp_path / "ids.jsonl"))) is TokenFileReader
    assert type(open_source(folder)) is TokenFileReader
    assert type(open_source(datasets.Dataset.from_dict({"input_ids": DOCUMENTS}))) is HuggingFaceTokenReader
    assert type(open_source(tmp_path / "images")) is ShardReader  # images as before
    assert type(open_source(image_folder)) is FolderReader
    with_metadata = tmp_path / "with_metadata"
    shutil.copytree(image_folder, with_metadata)
    (with_metadata / "dataset_info.json").write_text("{}")
    assert type(open_source(with_metadata)) is FolderReader  # a folder's .json is no JSON Lines source
    assert type(open_source(indexed_list)) is FileListReader
    assert type(open_source(tmp_path / "list.parquet")) is FileListReader  # path, label: an image list
