"""A stallfree Loader under Lightning's fit loop: two epochs, each sample once per epoch, a new order each epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stallfree import Loader
from stallfree.transforms import CenterCrop, Normalize

lightning = pytest.importorskip("lightning")


class Tiny(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 40)
        self.seen: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(self, batch, batch_idx):
        images, labels, extra = batch
        self.seen[-1].extend(extra["index"].tolist())
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_two_epochs_under_trainer_fit(indexed_list: Path) -> None:
    loader = Loader(indexed_list, batch_size=8, transform=[CenterCrop(8), Normalize()], num_threads=1, seed=2,
                    columns=["index"])
    model = Tiny()
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_dataloaders=loader)
    assert len(model.seen) == 2 and trainer.global_step == 2 * len(loader)
    first, second = model.seen
    assert sorted(first) == sorted(second) == list(range(37))  # each sample once per epoch
    assert first != second  # the second epoch draws its own order
