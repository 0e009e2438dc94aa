"""A stallfree Loader under Lightning's fit loop: two epochs, each sample once per epoch, a new order each epoch."""

from __future__ import annotations

from pathlib import Path

import lightning  # in the test extra: CI runs this file
import torch

from stallfree import Loader
from stallfree.transforms import CenterCrop, Normalize


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
                    shuffle=True, columns=["index"])
    model = Tiny()
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, train_dataloaders=loader)
    assert len(model.seen) == 2 and trainer.global_step == 2 * len(loader)
    first, second = model.seen
    assert sorted(first) == sorted(second) == list(range(37))  # each sample once per epoch
    assert first != second  # the second epoch draws its own order


class Recording(lightning.LightningModule):
    """Records each training batch's sample indices and a checksum of its pixels; validates on a second Loader."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 40)
        self.steps: list[tuple[int, list[int], float]] = []
        self.validated: list[int] = []

    def training_step(self, batch, batch_idx):
        images, labels, extra = batch
        self.steps.append((self.current_epoch, extra["index"].tolist(), float(images.double().sum())))
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), labels)

    def validation_step(self, batch, batch_idx):
        images, labels, extra = batch
        self.validated.extend(extra["index"].tolist())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loaders(indexed_list: Path) -> tuple[Loader, Loader]:
    from stallfree.transforms import RandomHorizontalFlip, RandomResizedCrop

    train = Loader(indexed_list, batch_size=4, transform=[RandomResizedCrop(8), RandomHorizontalFlip(), Normalize()],
                   num_threads=1, seed=5, shuffle=True, columns=["index"])
    val = Loader(indexed_list, batch_size=8, transform=[CenterCrop(8), Normalize()], num_threads=1, shuffle=False,
                 columns=["index"])
    return train, val


def _trainer(tmp_path: Path, **kwargs) -> lightning.Trainer:
    return lightning.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0, **kwargs)


def test_fit_with_train_and_val_loaders_and_a_bit_exact_resume_from_a_mid_epoch_checkpoint(
    indexed_list: Path, tmp_path: Path
) -> None:
    # Uninterrupted: two epochs, validating after each.
    whole = Recording()
    train, val = _loaders(indexed_list)
    _trainer(tmp_path / "whole", max_epochs=2, enable_checkpointing=False).fit(whole, train, val)
    per_epoch = len(train)
    assert len(whole.steps) == 2 * per_epoch
    assert sorted(whole.validated) == sorted(list(range(37)) * 2)  # each validation sample once per validation
    for epoch in (0, 1):
        seen = [i for e, rows, _ in whole.steps if e == epoch for i in rows]
        assert sorted(seen) == list(range(37))

    # Interrupted: stop after 3 steps of the second epoch with a checkpoint there, then resume from it.
    stop_at = per_epoch + 3
    saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=stop_at,
                                                        save_top_k=-1, save_last=False)
    first = Recording()
    train, val = _loaders(indexed_list)
    _trainer(tmp_path / "first", max_steps=stop_at, callbacks=[saver]).fit(first, train, val)
    checkpoint = next((tmp_path / "ckpt").glob("*.ckpt"))
    saved = torch.load(checkpoint, weights_only=False)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["batcher"]["batches"] == 3  # the Loader's own

    second = Recording()
    train, val = _loaders(indexed_list)  # fresh Loaders, as in a new process
    _trainer(tmp_path / "second", max_epochs=2).fit(second, train, val, ckpt_path=checkpoint)
    assert first.steps + second.steps == whole.steps  # the same samples, pixels and order, none lost or repeated


def test_reloading_the_dataloaders_every_epoch_trains_each_epochs_own_order(indexed_list: Path) -> None:
    """Issue 44, item 12: Lightning checks the reloaded dataloader with an ``iter()`` it drops, then iterates it."""

    def make() -> Loader:
        return Loader(indexed_list, batch_size=8, transform=[CenterCrop(8), Normalize()], num_threads=1, seed=2,
                      shuffle=True, columns=["index"])

    def order(epoch: int) -> list[int]:
        loader = make()
        loader.set_epoch(epoch)
        return [i for _, _, extra in loader for i in extra["index"].tolist()]

    model = Tiny()
    trainer = lightning.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                reload_dataloaders_every_n_epochs=1)
    trainer.fit(model, train_dataloaders=make())
    # Before: epoch 1 trained epoch 2's permutation and epoch 2 epoch 3's.
    assert model.seen == [order(0), order(1), order(2)]
