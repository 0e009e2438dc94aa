"""Token ingest: text tokenized once (JSON Lines, Parquet, CSV, a folder of them) or token ids, into token shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from stallfree.ingest.manifest import read_manifest
from stallfree.ingest.token_runner import ingest_tokens
from stallfree.ingest.token_writer import TokenOptions


def rows_of(out: Path) -> list[dict]:
    """Every row of the token shards in ``out``, in the manifest's order."""
    rows = []
    for shard in read_manifest(out)["shards"]:
        with pa.memory_map(str(out / shard["file"])) as source:
            rows += ipc.open_file(source).read_all().to_pylist()
    return rows


def write(path: Path, records: list[dict]) -> Path:
    """``records`` as the file ``path`` says: .jsonl, .parquet or .csv."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=17)
    else:
        pacsv.write_csv(pa.Table.from_pylist(records), path)
    return path


@pytest.fixture(scope="module")
def tokenizer(bpe_tokenizer: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(bpe_tokenizer))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_every_row_holds_what_the_tokenizer_encodes(suffix, texts, bpe_tokenizer, tokenizer, tmp_path):
    source = write(tmp_path / f"docs{suffix}", [{"id": i, "text": t} for i, t in enumerate(texts)])
    summary = ingest_tokens(source, tmp_path / "out", TokenOptions(tokenizer=str(bpe_tokenizer), shard_mb=0.001))
    rows = rows_of(tmp_path / "out")
    assert [r["tokens"] for r in rows] == [tokenizer.encode(t).ids for t in texts]
    assert [r["length"] for r in rows] == [len(tokenizer.encode(t).ids) for t in texts]
    assert [r["source"] for r in rows] == [f"docs{suffix}:{i}" for i in range(len(texts))]
    manifest = read_manifest(tmp_path / "out")
    lengths = np.load(tmp_path / "out" / "lengths.npy")
    assert lengths.dtype == np.int32 and lengths.tolist() == [r["length"] for r in rows]
    assert manifest["kind"] == "tokens" and manifest["token_dtype"] == "uint16"
    assert manifest["vocab_size"] == tokenizer.get_vocab_size() == 300
    assert manifest["documents"] == summary["documents"] == len(texts)
    assert manifest["tokens"] == summary["tokens"] == int(lengths.sum())
    assert len(manifest["shards"]) == summary["shards"] > 1  # cut by --shard-size
    assert {"name": "tokens", "type": "list<item: uint16>"} in manifest["schema"]


def test_a_folder_of_files_is_read_file_by_file_in_name_order(texts, bpe_tokenizer, tokenizer, tmp_path):
    folder = tmp_path / "corpus"
    write(folder / "b.parquet", [{"text": t} for t in texts[40:80]])
    write(folder / "a.jsonl", [{"text": t} for t in texts[:40]])
    write(folder / "c.csv", [{"text": t} for t in texts[80:]])
    (folder / "notes.txt").write_text("not a source file")
    (folder / "dataset_info.json").write_text('{"text": "a folder\'s .json is its metadata, not a document"}')
    ingest_tokens(folder, tmp_path / "out", TokenOptions(tokenizer=str(bpe_tokenizer)))
    rows = rows_of(tmp_path / "out")
    assert [r["tokens"] for r in rows] == [tokenizer.encode(t).ids for t in texts]
    assert [r["source"] for r in rows[39:41]] == ["a.jsonl:39", "b.parquet:0"]
    assert rows[-1]["source"] == f"c.csv:{len(texts) - 81}"


def test_a_transformers_folder_encodes_as_the_transformers_tokenizer_does(texts, bpe_tokenizer, tmp_path):
    from tokenizers import Tokenizer, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    backend = Tokenizer.from_file(str(bpe_tokenizer))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>").save_pretrained(tmp_path / "tok")
    source = write(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    ingest_tokens(source, tmp_path / "out", TokenOptions(tokenizer=str(tmp_path / "tok"), add_eos=""))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / "tok"), local_files_only=True)
    assert [r["tokens"] for r in rows_of(tmp_path / "out")] == [theirs(t)["input_ids"] + [2] for t in texts]


def test_bos_and_eos_are_added_once_and_special_tokens_can_be_left_out(texts, bpe_tokenizer, tmp_path):
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_file(str(bpe_tokenizer))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(tmp_path / "with_bos.json"))
    source = write(tmp_path / "docs.jsonl", [{"text": t} for t in texts[:20]])
    plain = [tokenizer.encode(t, add_special_tokens=False).ids for t in texts[:20]]
    ingest_tokens(source, tmp_path / "a", TokenOptions(tokenizer=str(tmp_path / "with_bos.json"), add_bos="<s>",
                                                       add_eos="</s>"))
    assert [r["tokens"] for r in rows_of(tmp_path / "a")] == [[1, *ids, 2] for ids in plain]  # <s> not doubled
    ingest_tokens(source, tmp_path / "b", TokenOptions(tokenizer=str(tmp_path / "with_bos.json"),
                                                       special_tokens=False))
    assert [r["tokens"] for r in rows_of(tmp_path / "b")] == plain


def test_the_tokenizer_files_truncation_is_turned_off(texts, bpe_tokenizer, tokenizer, tmp_path):
    from tokenizers import Tokenizer

    cut = Tokenizer.from_file(str(bpe_tokenizer))
    cut.enable_truncation(max_length=4)
    cut.save(str(tmp_path / "cut.json"))
    source = write(tmp_path / "docs.jsonl", [{"text": t} for t in texts])
    ingest_tokens(source, tmp_path / "out", TokenOptions(tokenizer=str(tmp_path / "cut.json")))
    assert [r["tokens"] for r in rows_of(tmp_path / "out")] == [tokenizer.encode(t).ids for t in texts]


@pytest.mark.parametrize(("column", "named"), [("input_ids", None), ("tokens", None), ("ids", "ids")])
def test_token_ids_are_ingested_as_they_are(column, named, tmp_path):
    documents = [[5, 6, 7], [8], list(range(300))]
    source = write(tmp_path / "ids.parquet", [{column: d, "other": 1} for d in documents])
    ingest_tokens(source, tmp_path / "out", TokenOptions(tokens_field=named))
    assert [r["tokens"] for r in rows_of(tmp_path / "out")] == documents
    manifest = read_manifest(tmp_path / "out")
    assert manifest["vocab_size"] is None and manifest["source"]["kind"] == "tokens"


@pytest.mark.parametrize(("top", "vocab", "dtype"), [(65535, None, "uint16"), (65536, None, "int32"),
                                                      (10, 70000, "int32"), (65535, 65536, "uint16")])
def test_ids_are_uint16_when_every_id_fits_else_int32(top, vocab, dtype, tmp_path):
    documents = [[0, 1, top], [top]]
    source = write(tmp_path / "ids.jsonl", [{"input_ids": d} for d in documents])
    ingest_tokens(source, tmp_path / "out", TokenOptions(vocab_size=vocab))
    assert read_manifest(tmp_path / "out")["token_dtype"] == dtype
    assert str(pa.ipc.open_file(pa.memory_map(str(tmp_path / "out" / "shard-00000.arrow"))).schema.field(
        "tokens").type.value_type) == dtype
    assert [r["tokens"] for r in rows_of(tmp_path / "out")] == documents


#: (the row as a JSON line, the reason given for it)
BAD_TEXT = [
    ('{"text": 5}', "not text (int 5)"),
    ('{"text": ""}', "empty text"),
    ('{"text": "   "}', "empty text"),
    ('{"text": null}', "missing (null)"),
    ('{"body": "no text field"}', "no field 'text'"),
    ("{not json", "not valid JSON"),
]
BAD_IDS = [
    ('{"input_ids": [1, 2, 70000]}', "token id 70000 is beyond the vocabulary (vocab_size 1000)"),
    ('{"input_ids": [3, -1]}', "negative token id -1"),
    ('{"input_ids": []}', "empty document (no tokens)"),
    ('{"input_ids": [1, null]}', "a null token id"),
    ('{"input_ids": "1 2 3"}', "not a list of token ids"),
    ('{"other": [1]}', "no field 'input_ids'"),
]


def _with_bad_row(path: Path, good: list[str], bad: str) -> Path:
    path.write_text("\n".join([*good[:3], bad, *good[3:]]) + "\n")
    return path


@pytest.mark.parametrize(("bad", "reason"), BAD_TEXT + BAD_IDS)
def test_a_bad_row_raises_naming_the_file_and_row(bad, reason, bpe_tokenizer, tmp_path):
    text = "text" in bad or "body" in bad or "{not" in bad
    good = [json.dumps({"text": "a b c"}) if text else json.dumps({"input_ids": [1, 2]})] * 5
    source = _with_bad_row(tmp_path / "docs.jsonl", good, bad)
    options = (TokenOptions(tokenizer=str(bpe_tokenizer), on_error="raise") if text
               else TokenOptions(tokens_field="input_ids", vocab_size=1000, on_error="raise"))
    with pytest.raises(ValueError, match=rf"docs\.jsonl row 3: {reason.split(' (')[0]}"):
        ingest_tokens(source, tmp_path / "out", options)


@pytest.mark.parametrize(("bad", "reason"), BAD_TEXT + BAD_IDS)
def test_a_bad_row_is_skipped_listed_and_counted(bad, reason, bpe_tokenizer, tmp_path):
    text = "text" in bad or "body" in bad or "{not" in bad
    good = [json.dumps({"text": f"a b {i}"}) if text else json.dumps({"input_ids": [1, i]}) for i in range(5)]
    source = _with_bad_row(tmp_path / "docs.jsonl", good, bad)
    options = (TokenOptions(tokenizer=str(bpe_tokenizer)) if text
               else TokenOptions(tokens_field="input_ids", vocab_size=1000))
    summary = ingest_tokens(source, tmp_path / "out", options)
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 1 and rejected[0]["path"] == "docs.jsonl:3" and reason in rejected[0]["reason"]
    assert summary["rejected"] == read_manifest(tmp_path / "out")["rejected"] == 1
    assert [r["source"] for r in rows_of(tmp_path / "out")] == [f"docs.jsonl:{i}" for i in (0, 1, 2, 4, 5)]


def test_bad_parquet_rows_are_named_by_their_row(tmp_path):
    documents = [[1], None, [2, None], [], [-4], [5]]
    source = write(tmp_path / "ids.parquet", [{"input_ids": d} for d in documents])
    ingest_tokens(source, tmp_path / "out", TokenOptions())
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    assert rejected == [
        {"path": "ids.parquet:1", "reason": "missing (null)"},
        {"path": "ids.parquet:2", "reason": "a null token id"},
        {"path": "ids.parquet:3", "reason": "empty document (no tokens)"},
        {"path": "ids.parquet:4", "reason": "negative token id -4"},
    ]
    assert [r["tokens"] for r in rows_of(tmp_path / "out")] == [[1], [5]]


def test_a_missing_or_mistyped_column_is_an_error_naming_the_file(bpe_tokenizer, tmp_path):
    source = write(tmp_path / "docs.parquet", [{"body": "x", "n": 1}])
    with pytest.raises(ValueError, match=r"docs\.parquet has no column 'text'; its columns are \['body', 'n'\]"):
        ingest_tokens(source, tmp_path / "a", TokenOptions(tokenizer=str(bpe_tokenizer)))
    with pytest.raises(ValueError, match=r"docs\.parquet: column 'n' is int64, not text"):
        ingest_tokens(source, tmp_path / "b", TokenOptions(tokenizer=str(bpe_tokenizer), text_field="n"))
    with pytest.raises(ValueError, match="holds text .* pass --tokenizer PATH"):
        ingest_tokens(write(tmp_path / "t.jsonl", [{"text": "x"}]), tmp_path / "c", TokenOptions())


def test_nothing_is_downloaded_for_a_tokenizer_that_is_not_there(tmp_path):
    source = write(tmp_path / "docs.jsonl", [{"text": "x"}])
    with pytest.raises(FileNotFoundError, match="gpt2 does not exist .*nothing is downloaded"):
        ingest_tokens(source, tmp_path / "out", TokenOptions(tokenizer="gpt2"))
