"""An image-text ingest killed part-way resumes from its last shard and writes the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from stallfree.ingest import image_text_runner
from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text
from stallfree.ingest.verify import verify


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _slow_ingest(source: Path, out: Path, options: ImageTextOptions) -> None:
    write = image_text_runner.write_image_text_shard

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return write(*args, **kwargs)

    image_text_runner.write_image_text_shard = slow  # this child process only
    ingest_image_text(source, out, options)


@pytest.fixture(scope="module")
def source(texts: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 conversations over 3 images, a bad row (a missing image) every 25 rows."""
    from stallfree.ingest.synthetic import make_image_folder

    folder = tmp_path_factory.mktemp("src")
    make_image_folder(folder / "img", num_classes=1, per_class=3, size=(12, 16))
    names = sorted(p.relative_to(folder).as_posix() for p in (folder / "img").rglob("*.jpg"))
    rows = [{"image": "img/missing.jpg" if i % 25 == 3 else names[i % 3],
             "conversations": [{"from": "human", "value": f"<image>\n{text[:40]}"},
                               {"from": "gpt", "value": text}]} for i, text in enumerate(texts)]
    path = folder / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def options(bpe_tokenizer: Path) -> ImageTextOptions:
    return ImageTextOptions(layout="conversations", tokenizer=str(bpe_tokenizer), shard_mb=0.004)


@pytest.fixture(scope="module")
def reference(source: Path, options: ImageTextOptions, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    ingest_image_text(source, out, options)
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
    summary = ingest_image_text(source, out, options)
    assert summary["resumed_shards"] >= 4 and summary["written_shards"] >= 1
    assert files(out) == files(reference)  # shards, lengths.npy, image_counts.npy, rejected.jsonl, manifest.json
    assert summary["rejected"] == 5 and verify(out, decode=True) == []
    again = ingest_image_text(source, out, options)
    assert again["written_shards"] == 0 and files(out) == files(reference)


def test_a_folder_of_another_plan_is_refused(source, options, reference, bpe_tokenizer, tmp_path):
    out = tmp_path / "out"
    ingest_image_text(source, out, options)
    other = ImageTextOptions(**{**options.to_json(), "image_placeholder": "<img>"})
    with pytest.raises(ValueError, match="holds a finished ingest of a different source or options"):
        ingest_image_text(source, out, other)
