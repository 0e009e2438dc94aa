"""``stallfree train --model gpt_tiny`` (issue 46, item 5): a token model trains on packed sequences through the same
path as the image models, across pipeline stages and data-parallel replicas, and its summary counts tokens.

The jobs share one pair of spawned processes (``train_many``); each is compared with the same model trained in this
process on the same generated batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from stallfree.cli import main
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.jobs import train_many
from stallfree.stage_runtime.models.gpt import IGNORE_INDEX, lm_loss
from stallfree.stage_runtime.models.tasks import LanguageModeling
from stallfree.stage_runtime.models.zoo import build_model
from stallfree.stage_runtime.train.feed import Feed
from stallfree.stage_runtime.train.report import format_summary
from stallfree.stage_runtime.train.token_feed import TokenBatches

STEPS, S, VOCAB, LR = 8, 16, 32, 3e-3
TOKENS = {"model": "gpt_tiny", "seq_len": S, "vocab_size": VOCAB, "samples": 64, "batch_size": 4, "microbatches": 2,
          "optimizer": "adamw", "lr": LR, "progress": False, "timeout_s": 60}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("tokens")

    def job(name: str, **kw: Any) -> TrainConfig:
        return TrainConfig.from_flags(**{**TOKENS, "max_steps": STEPS, "out_dir": str(out / name), **kw})

    configs = {
        # the 4 layers (embedding, 2 blocks, head) in 2 stages: the hidden states and the documents cross the cut
        "pp2": job("pp2", stages=2, schedule="1f1b", balance=(2, 2)),
        "dp2": job("dp2", stages=1, dp=2),  # 2 replicas, each its shard of the batches
        "half": job("half", stages=2, schedule="1f1b", balance=(2, 2), max_steps=STEPS // 2),
        "resumed": job("resumed", stages=2, schedule="1f1b", balance=(2, 2), resume=True,
                       checkpoint_dir=str(out / "half" / "checkpoints")),
    }
    summaries = dict(zip(configs, train_many(list(configs.values())), strict=True))
    return {"configs": configs, "summaries": summaries}


def _losses(config: TrainConfig) -> list[float]:
    rows = [json.loads(line) for line in (Path(config.report.out_dir) / "train.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


def _reference(replicas: int) -> list[float]:
    """Replica 0's loss per step, training gpt_tiny in this process: each replica's micro-batches, averaged."""
    torch.manual_seed(0)
    model = build_model("gpt_tiny", VOCAB, 32, seq_len=S)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    feeds = [iter(TokenBatches(64, 4, S, VOCAB, seed=0, rank=r, world_size=replicas)) for r in range(replicas)]
    losses = []
    for _ in range(STEPS):
        shown = 0.0
        for r, feed in enumerate(feeds):
            batch = next(feed)
            x = torch.stack([batch["input_ids"], batch["position_ids"], batch["document_index"]], dim=1)
            for xm, ym in zip(x.chunk(2), batch["labels"].chunk(2), strict=True):
                loss = lm_loss(model(xm), ym)
                (loss / 2 / replicas).backward()
                shown += loss.item() / 2 if r == 0 else 0.0
        optimizer.step()
        optimizer.zero_grad()
        losses.append(shown)
    return losses


@pytest.mark.parametrize(("name", "replicas"), [("pp2", 1), ("dp2", 2)])
def test_a_token_job_trains_as_the_model_does_in_one_process(runs: dict[str, Any], name: str, replicas: int) -> None:
    got, want = _losses(runs["configs"][name]), _reference(replicas)
    assert len(got) == STEPS
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4, (got, want)
    assert got[-1] < got[0] - 0.1  # it trains (from log(32) = 3.47; tests/stage_runtime/models: to what it learns)


def test_a_resumed_token_job_continues_as_the_uninterrupted_one(runs: dict[str, Any]) -> None:
    whole, resumed = _losses(runs["configs"]["pp2"]), _losses(runs["configs"]["resumed"])
    assert resumed == whole[STEPS // 2:]  # bit-identical: the weights, the optimizer and the feed's position


def _padding(replicas: int) -> float:
    """The padding's share of the positions the job's replicas train after its first step."""
    feeds = [iter(TokenBatches(64, 4, S, VOCAB, seed=0, rank=r, world_size=replicas)) for r in range(replicas)]
    real = slots = 0
    for step in range(STEPS):
        for feed in feeds:
            documents = next(feed)["document_index"]
            if step:
                real, slots = real + int((documents >= 0).sum()), slots + documents.numel()
    return 1 - real / slots


def test_a_token_jobs_summary_counts_tokens(runs: dict[str, Any]) -> None:
    for name, replicas in (("pp2", 1), ("dp2", 2)):
        summary = runs["summaries"][name]
        assert summary["unit"] == "tokens" and "images_per_s" not in summary
        assert summary["tokens_per_s"] > summary["real_tokens_per_s"] > 0
        # every replica's real tokens, over the steps the throughput is measured on (all but the first)
        assert summary["padding_fraction"] == pytest.approx(_padding(replicas), abs=1e-12) and 0 < _padding(replicas)
        assert summary["eval_top1"] is not None  # the generated held-out split, scored by the next token
        assert summary["books"]["unit"] == "tokens" and "could_do_tokens_per_s" in summary["books"]["job"]
        text = format_summary(summary)
        assert " tokens/s" in text and "images/s" not in text and "img/s" not in text, text
    rows = (Path(runs["configs"]["pp2"].report.out_dir) / "train.jsonl").read_text().splitlines()
    assert "tokens_per_s" in json.loads(rows[0]) and "images_per_s" not in json.loads(rows[0])


def test_generated_token_batches_are_the_loaders_packed_batches() -> None:
    feed = TokenBatches(16, 4, 24, 50, seed=3)
    assert isinstance(feed, Feed) and len(feed) == 4  # what the trainer reads of every feed
    batch = next(iter(feed))
    ids, labels, positions, documents = (batch[k] for k in ("input_ids", "labels", "position_ids", "document_index"))
    for t in (ids, labels, positions, documents):
        assert t.shape == (4, 24) and t.dtype == torch.int64
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    assert torch.equal(labels == IGNORE_INDEX, starts | (documents < 0))  # -100: padding and each document's start
    assert torch.equal(labels[labels != IGNORE_INDEX], ids[labels != IGNORE_INDEX])
    assert (positions[starts] == 0).all() and (positions[~starts] == positions.roll(1, 1)[~starts] + 1).all()
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and int(cu[0]) == 0 and int(cu[-1]) == 4 * 24
    assert batch["max_seqlen"] == int((cu[1:] - cu[:-1]).max())
    with pytest.raises(ValueError, match=r"a packed batch of 24 tokens per row reached a job of --seq-len 16; give "
                       r"the Loader Packing\(seq_len=16\)"):
        LanguageModeling(16, 50).batch(batch)


def test_a_token_jobs_flags_come_back_from_its_summary() -> None:
    config = TrainConfig.from_flags(**{**TOKENS, "stages": 2})
    assert config.model.kind == config.unit == "tokens" and config.units_per_step == 4 * S
    assert TrainConfig.from_flags(**config.to_json()) == config


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "gpt_tiny", "--feed", "torch"], r"^--feed torch does not apply to --model gpt_tiny, a token model"),
    # (issue 48: `--accelerator sim:R` trains a token model now, tests/stage_runtime/train/test_train_balance.py)
    (["--model", "gpt_tiny", "--balance-batches", "compute"], r"^--balance-batches compute balances the Loader's "
                                                              r"packs of a token source, but --synthetic generates"),
    (["--model", "gpt_tiny", "--attention-span", "0"], r"^--attention-span must be >= 1, got 0$"),
    (["--model", "mlp", "--balance-batches", "tokens"], r"^--balance-batches balances a token model's packs"),
    (["--model", "gpt_tiny", "--classes", "5"], r"^--classes counts an image model's classes; gpt_tiny's outputs are "
                                                r"its vocabulary: give --vocab-size$"),
    (["--model", "gpt_tiny", "--seq-len", "1"], r"^--seq-len must be >= 2, got 1$"),
    (["--model", "mlp", "--seq-len", "64"], r"^--seq-len applies to a token model \(gpt_tiny\), not to mlp: drop it "
                                            r"or choose --model gpt_tiny$"),
])
def test_a_token_jobs_bad_flags_are_refused_in_one_line(argv: list[str], message: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--synthetic", "64", *argv, "--batch-size", "8", "--no-progress",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("stallfree train: error: "), err
    assert __import__("re").search(message, err[len("stallfree train: error: "):]), err
    assert not (tmp_path / "run").exists()


def test_a_token_job_trains_on_an_ingested_source_through_the_loaders_packing(
        tmp_path: Path, image_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The real path: ids ingested into token shards, packed by the Loader, trained by gpt_tiny over 2 stages.
    from stallfree.ingest.token_runner import ingest_tokens
    from stallfree.ingest.token_writer import TokenOptions

    gen = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(120):
        n, start = int(torch.randint(5, 90, (1,), generator=gen)), int(torch.randint(0, 20, (1,), generator=gen))
        rows.append(json.dumps({"input_ids": [(start + 2 * k) % 40 for k in range(n)]}))
    (tmp_path / "ids.jsonl").write_text("\n".join(rows) + "\n")
    ingest_tokens(tmp_path / "ids.jsonl", tmp_path / "tokens", TokenOptions(vocab_size=40))
    out = tmp_path / "run"
    assert main(["train", str(tmp_path / "tokens"), "--model", "gpt_tiny", "--seq-len", "32", "--batch-size", "4",
                 "--max-steps", "6", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unit"] == "tokens" and summary["tokens_per_s"] > 0
    assert summary["config"]["vocab_size"] is None  # taken from the shards' manifest (40)
    capsys.readouterr()
    assert main(["train", str(image_folder), "--model", "gpt_tiny", "--out", str(tmp_path / "x"),
                 "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gives images, but --model gpt_tiny trains on token sequences" in err
