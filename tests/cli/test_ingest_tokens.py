"""``stallfree ingest`` of documents: the token flags, the summary, the exit codes; ``info`` and ``verify`` on it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stallfree.cli import main


@pytest.fixture
def corpus(texts: list[str], tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts) + '{"text": ""}\n')
    return path


def test_text_is_ingested_with_a_tokenizer_and_summarised_as_json(corpus, bpe_tokenizer, texts, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ingest", str(corpus), str(out), "--tokenizer", str(bpe_tokenizer), "--add-eos", "</s>",
                 "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # JSON alone on stdout
    assert summary["documents"] == len(texts) and summary["rejected"] == 1 and summary["token_dtype"] == "uint16"
    assert f"{len(texts)} documents, {summary['tokens']} tokens (uint16, vocabulary 300)" in captured.err
    assert f"1 rejected (see {out}/rejected.jsonl)" in captured.err
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert f"{len(texts)} documents, {summary['tokens']} tokens" in info and "columns: tokens, length, source" in info
    assert main(["verify", str(out), "--decode"]) == 0
    assert f"{out}: OK" in capsys.readouterr().err


def test_token_ids_need_no_flag(tmp_path, capsys):
    pq.write_table(pa.table({"input_ids": [[1, 2], [3]]}), tmp_path / "ids.parquet")
    assert main(["ingest", str(tmp_path / "ids.parquet"), str(tmp_path / "out"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"] == 2 and summary["tokens"] == 3 and summary["vocab_size"] is None


def test_verify_finds_a_lengths_file_that_disagrees_with_the_shards(tmp_path, capsys):
    import numpy as np

    from stallfree.ingest.labels import save_labels
    from stallfree.ingest.manifest import read_manifest, write_manifest

    pq.write_table(pa.table({"input_ids": [[1, 2], [3]]}), tmp_path / "ids.parquet")
    out = tmp_path / "out"
    assert main(["ingest", str(tmp_path / "ids.parquet"), str(out)]) == 0
    manifest = read_manifest(out)
    manifest["lengths"] = save_labels(out, np.array([2, 5], np.int32), "lengths.npy")  # listed, but wrong
    write_manifest(out / "manifest.json", manifest)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    assert "lengths.npy: rows 0..1 differ from shard-00000.arrow's length column" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "message"), [
    (["--raw", "4x4"], "--raw applies to images, not to a token ingest"),
    (["--max-side", "8", "--validate"], "--max-side, --validate apply to images"),
    (["--workers", "2"], "--workers applies to images: a token ingest encodes on the tokenizer's own threads"),
    (["--tokens-field", "ids", "--text-field", "text"], "--text-field and --tokens-field exclude each other"),
    (["--add-eos", "</s>", "--tokens-field", "ids"], "--add-bos and --add-eos name tokens of the --tokenizer"),
])
def test_flags_that_do_not_apply_are_one_line_and_exit_2(corpus, tmp_path, extra, message, capsys):
    assert main(["ingest", str(corpus), str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_tokenizer_that_is_not_there_is_one_line(corpus, tmp_path, capsys):
    assert main(["ingest", str(corpus), str(tmp_path / "out"), "--tokenizer", "gpt2"]) == 2
    assert "--tokenizer gpt2 does not exist" in capsys.readouterr().err


def test_nothing_ingested_exits_1_naming_the_rejected_rows(tmp_path, capsys):
    (tmp_path / "ids.jsonl").write_text('{"input_ids": []}\n{"input_ids": [-1]}\n')
    assert main(["ingest", str(tmp_path / "ids.jsonl"), str(tmp_path / "out")]) == 1
    assert "nothing was ingested: all 2 rows were rejected" in capsys.readouterr().err


def test_on_error_raise_names_the_file_and_row(tmp_path, capsys):
    (tmp_path / "ids.jsonl").write_text('{"input_ids": [1]}\n{"input_ids": [-1]}\n')
    assert main(["ingest", str(tmp_path / "ids.jsonl"), str(tmp_path / "out"), "--on-error", "raise"]) == 2
    assert f"{tmp_path}/ids.jsonl row 1: negative token id -1" in capsys.readouterr().err
