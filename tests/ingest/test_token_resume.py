"""A token ingest killed part-way resumes from its last shard and writes the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from stallfree.ingest import token_runner
from stallfree.ingest.token_runner import ingest_tokens
from stallfree.ingest.token_writer import TokenOptions
from stallfree.ingest.verify import verify


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _slow_ingest(source: Path, out: Path, options: TokenOptions) -> None:
    write = token_runner.write_token_shard

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return write(*args, **kwargs)

    token_runner.write_token_shard = slow  # this child process only
    ingest_tokens(source, out, options)


@pytest.fixture(scope="module")
def source(texts: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The texts as JSON Lines, with a bad row every 25 rows (rejections in several shards)."""
    path = tmp_path_factory.mktemp("src") / "docs.jsonl"
    lines = [json.dumps({"text": 7} if i % 25 == 3 else {"text": text}) for i, text in enumerate(texts)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def options(bpe_tokenizer: Path) -> TokenOptions:
    return TokenOptions(tokenizer=str(bpe_tokenizer), add_eos="</s>", shard_mb=0.0002)  # about 100 ids a shard


@pytest.fixture(scope="module")
def reference(source: Path, options: TokenOptions, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    ingest_tokens(source, out, options)
    return out


def test_kill_9_then_rerun_gives_the_same_files(source, options, reference, tmp_path):
    assert len([name for name in files(reference) if name.startswith("shard-")]) > 10
    out = tmp_path / "out"
    child = multiprocessing.get_context("spawn").Process(target=_slow_ingest, args=(source, out, options))
    child.start()
    deadline = time.monotonic() + 60
    while len(list((out / ".ingest").glob("shard-*.json"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert not (out / "manifest.json").exists(), "the ingest finished before the kill: make the data larger"
    summary = ingest_tokens(source, out, options)
    assert summary["resumed_shards"] >= 4 and summary["written_shards"] >= 1
    assert files(out) == files(reference)  # shards, lengths.npy, rejected.jsonl, manifest.json
    assert verify(out) == []
    again = ingest_tokens(source, out, options)
    assert again["written_shards"] == 0 and files(out) == files(reference)


def test_a_run_stopped_by_a_bad_row_resumes_with_skip(source, options, reference, tmp_path):
    out = tmp_path / "out"
    strict = TokenOptions(**{**options.to_json(), "on_error": "raise"})
    with pytest.raises(ValueError, match=r"docs\.jsonl row 3: not text \(int 7\)"):
        ingest_tokens(source, out, strict)
    written = len(list((out / ".ingest").glob("shard-*.json")))
    assert written >= 1  # the shards before the bad row
    summary = ingest_tokens(source, out, options)  # on_error decides no shard's bytes: the same job
    assert summary["resumed_shards"] == written
    assert files(out) == files(reference)


def test_other_options_in_the_same_folder_are_refused(source, options, reference, tmp_path):
    out = tmp_path / "out"
    ingest_tokens(source, out, options)
    with pytest.raises(ValueError, match="holds a finished ingest of a different source or options"):
        ingest_tokens(source, out, TokenOptions(**{**options.to_json(), "add_eos": None}))
