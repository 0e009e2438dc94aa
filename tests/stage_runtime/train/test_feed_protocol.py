"""The trainer reads every feed through one protocol, ``Feed`` (issue 45, item 3): the Loader, torch's DataLoader
behind ``TorchFeed`` and the generated ``TensorBatches`` each have what it reads, and the trainer asks no feed what
it is (it asked ``hasattr(feed, "clock")`` to know who records the input waits)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.train import feed as feeds
from stallfree.stage_runtime.train.feed import Feed, TensorBatches, TorchFeed, build_feeds, make_feed

TRAIN = Path(feeds.__file__).parent


def test_every_feed_has_what_the_trainer_reads(image_folder: Path) -> None:
    loader = make_feed(str(image_folder), train=False, batch_size=4, image_size=8, num_classes=3, seed=0, replica=0,
                       replicas=1, samples=0, device="cpu", workers=1)
    torch_feed = TorchFeed(str(image_folder), 4, 8, train=True, seed=0, replica=0, replicas=1, workers=0)
    for feed in (loader, torch_feed, TensorBatches(16, 4, 8, 3)):
        assert isinstance(feed, Feed), type(feed).__name__
        images, labels = next(iter(feed))
        assert images.shape[0] == labels.shape[0] == 4 and len(feed) >= 1 and feed.classes


@pytest.mark.parametrize(("flags", "clocked", "own"), [
    ({"samples": 64}, False, 8),  # generated: 64 // 4 = 16 held out over 2 replicas, one batch of 8 each
    ({"data": "FOLDER", "feed": "torch"}, False, None),
    ({"data": "FOLDER", "eval_data": "FOLDER"}, True, None),
])
def test_rank_0s_feeds_say_who_records_the_waits_and_what_is_padding(image_folder: Path, flags: dict,
                                                                     clocked: bool, own: int | None) -> None:
    flags = {k: str(image_folder) if v == "FOLDER" else v for k, v in flags.items()}
    config = TrainConfig.from_flags(batch_size=8, microbatches=2, image_size=8, loader_threads=1, dp=2, **flags)
    made = build_feeds(config, replica=1, device="cpu", clock=StageClock())
    assert made.clocked is clocked  # only the Loader, given the clock, records its own input waits
    if config.feed.eval_data is None and config.feed.data is not None:
        assert made.held_out is None
    else:
        assert made.held_out is not None
        samples = own if own is not None else -(-(_images(image_folder) - 1) // 2)  # replica 1 of 2: ceil((n-1)/2)
        assert made.held_out_samples == samples


def _images(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file())


def test_the_trainer_asks_no_feed_what_it_is() -> None:
    for name in ("rank.py", "trainer.py", "evaluation.py"):
        text = (TRAIN / name).read_text()
        assert not re.search(r"hasattr\(|isinstance\([^)]*feed", text), name
        assert not re.search(r"feed\w*: Any", text), name
