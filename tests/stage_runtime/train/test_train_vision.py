"""``stallfree train --model vlm_tiny`` (issue 47, item 5): a transformer with a vision stem trains on packed
image-text sequences of the generated caption task, across pipeline stages, and the loss falls.

The feed is the contract's image-text batch dict (the Loader's), here generated (:class:`CaptionBatches`); the
Loader's own over ingested image-text shards is tested where the Loader's image-text packs are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from stallfree.cli import main
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.models.gpt import IGNORE_INDEX
from stallfree.stage_runtime.models.tasks import make_task
from stallfree.stage_runtime.models.zoo import build_model
from stallfree.stage_runtime.train.caption_feed import CAPTION_VOCAB, CaptionBatches
from stallfree.stage_runtime.train.feed import Feed

S, SIDE, P = 48, 16, 4  # an image of 16x16 pixels in patches of 4: 16 tokens; a caption 7 more


def test_generated_caption_batches_are_the_contracts_image_text_batches() -> None:
    feed = CaptionBatches(16, 4, S, image_size=SIDE, patch=P, seed=3)
    assert isinstance(feed, Feed) and len(feed) == 4  # what the trainer reads of every feed
    batch = next(iter(feed))
    ids, labels, positions, documents = (batch[k] for k in ("input_ids", "labels", "position_ids", "document_index"))
    for t in (ids, labels, positions, documents):
        assert t.shape == (4, S) and t.dtype == torch.int64
    image = ids == CAPTION_VOCAB
    pixels, owners = batch["pixel_values"], batch["image_document_index"]
    assert pixels.shape == (len(owners), 3, SIDE, SIDE) and pixels.dtype == torch.float32
    assert int(image.sum()) == 16 * len(owners) and len(owners) >= 4  # two documents a row
    # each image's 16 tokens open its document, images in row-major order of their tokens
    assert torch.equal(documents[image].view(-1, 16)[:, 0], owners) and (positions[image].view(-1, 16)[:, 0] == 0).all()
    starts = torch.ones_like(image)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    assert torch.equal(labels == IGNORE_INDEX, image | starts | (documents < 0))  # -100: images, starts, padding
    assert torch.equal(labels[labels != IGNORE_INDEX], ids[labels != IGNORE_INDEX])
    cu = batch["cu_seqlens"]
    assert int(cu[-1]) == 4 * S and batch["max_seqlen"] == int((cu[1:] - cu[:-1]).max())
    feed.load_state_dict(feed.state_dict())  # the feed contract's state, as token batches have it
    with pytest.raises(ValueError, match=r"a generated caption sample is up to 23 tokens \(16 of its image\), more "
                       r"than a row of --seq-len 20"):
        CaptionBatches(16, 4, 20, image_size=SIDE, patch=P)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread: a model this small waits on a second thread's hand-offs when the cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_the_model_reads_its_images_to_caption_them(one_thread: None) -> None:
    # Without the image a caption's colour (1 of 6) and shape (1 of 4) are guesses: the words' accuracy can't pass
    # ~0.66 (a, the, </s> and on/in given the place are free); reading the image it passes that (0.88 here).
    s, side, patch = 32, 16, 8  # 4 tokens an image: two documents a row
    torch.manual_seed(0)
    model = build_model("vlm_tiny", CAPTION_VOCAB, side, seq_len=s, patch=patch)
    task = make_task("tokens", image_size=side, seq_len=s, outputs=CAPTION_VOCAB, patch=patch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    feed = CaptionBatches(1024, 16, s, image_size=side, patch=patch)
    for epoch in range(3):
        feed.set_epoch(epoch)
        for item in feed:
            batch = task.batch(item)
            task.loss(model(batch.inputs), batch.targets).backward()
            optimizer.step()
            optimizer.zero_grad()
    right = counted = 0
    with torch.no_grad():
        for item in CaptionBatches(256, 16, s, image_size=side, patch=patch, split=1, shuffle=False):
            batch = task.batch(item)
            r, c = task.score(model(batch.inputs), batch.targets)
            right, counted = right + r, counted + c
    assert right / counted > 0.75, right / counted


@pytest.mark.slow
def test_a_vision_job_trains_end_to_end_in_two_stages_and_its_loss_falls(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["train", "--synthetic", "128", "--model", "vlm_tiny", "--seq-len", str(S), "--image-size",
                 str(SIDE), "--patch", str(P), "--stages", "2", "--batch-size", "8", "--microbatches", "2",
                 "--optimizer", "adamw", "--lr", "3e-3", "--epochs", "2", "--out", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 32 and sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 1.0, losses  # from log(54) = 4.0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unit"] == "tokens" and summary["eval_top1"] > 0.3
    assert TrainConfig.from_flags(**summary["config"]).model.vision == P


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "mlp", "--patch", "8"], r"^--patch applies to a vision model \(vlm_tiny\), not to mlp: drop it or "
                                         r"choose --model vlm_tiny$"),
    (["--model", "vlm_tiny", "--image-size", "30"], r"^--image-size 30 must be a multiple of --patch 8"),
    (["--model", "vlm_tiny", "--image-size", "64", "--seq-len", "64"], r"^an image of --image-size 64 is 64 tokens "
                                                                       r"\(patches of 8\), which leaves no room for "
                                                                       r"text in a row of --seq-len 64"),
    (["--model", "vlm_tiny", "--vocab-size", "99"], r"^--vocab-size does not apply to --synthetic's captions"),
    (["--model", "gpt_tiny", "--train-on", "assistant"], r"^--train-on assistant applies to a vision model's "
                                                         r"image-text source, but gpt_tiny is not a vision model"),
    (["--model", "vlm_tiny", "--train-on", "assistant"], r"^--train-on assistant applies to a vision model's "
                                                         r"image-text source, but --synthetic's captions are all"),
])
def test_a_vision_jobs_bad_flags_are_refused_in_one_line(argv: list[str], message: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--synthetic", "64", *argv, "--batch-size", "8", "--no-progress",
                 "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("stallfree train: error: "), err
    assert re.search(message, err[len("stallfree train: error: "):]), err
    assert not (tmp_path / "run").exists()



@pytest.mark.slow
@pytest.mark.parametrize(("layout", "seq_len", "train_on"), [("caption", 32, "all"), ("conversations", 64,
                                                                                      "assistant")])
def test_a_vision_job_trains_on_ingested_shards_through_the_loader(layout: Any, seq_len: int, train_on: str,
                                                                    tmp_path: Path) -> None:
    # The real path: the generated captions written as JSON Lines + JPEGs (a caption pair, or LLaVA's conversation
    # with its template and system prompt, trained on the reply alone), ingested as image-text shards, packed by the
    # Loader with each image's (16 / 8)**2 = 4 tokens, its images resized in the DALI graph, trained in 2 stages.
    from stallfree.ingest.image_text_runner import ImageTextOptions, ingest_image_text
    from stallfree.ingest.synthetic_captions import make_caption_dataset

    source = make_caption_dataset(tmp_path / "captions", count=192, size=(40, 48), vary_size=True, layout=layout)
    ingest_image_text(source, tmp_path / "shards", ImageTextOptions(
        layout=layout, tokenizer=str(tmp_path / "captions" / "tokenizer.json"), add_eos="</s>"))
    out = tmp_path / "run"
    assert main(["train", str(tmp_path / "shards"), "--model", "vlm_tiny", "--seq-len", str(seq_len),
                 "--image-size", "16", "--patch", "8", "--stages", "2", "--batch-size", "8", "--microbatches", "2",
                 "--optimizer", "adamw", "--lr", "3e-3", "--epochs", "2", "--train-on", train_on, "--out", str(out),
                 "--no-progress"]) == 0
    losses = [json.loads(line)["loss"] for line in (out / "train.jsonl").read_text().splitlines()]
    # from log(54) = 4.0: the caption's template first, then its words from the image
    assert len(losses) >= 16 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.5, losses
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unit"] == "tokens" and summary["config"]["vocab_size"] is None  # the shards' own (54)
