"""A Lightning DDP job on CPU, 2 processes, whose Loaders are built at the top of the script as the README shows.

``python lightning_ddp_job.py DATA OUT``, run by ``test_lightning_ddp.py``. Lightning runs this script again for
rank 1, with ``WORLD_SIZE``, ``LOCAL_RANK`` and ``NODE_RANK`` set but not ``RANK``, and makes the process group only
inside ``fit``. Three fits, each on Loaders built here before any of them: one uninterrupted epoch, one step with a
checkpoint after it, and the rest of that epoch resumed from the checkpoint. Each rank writes the sample indices
and the pixel sum of every batch it trained on to ``OUT/<fit>-rank<r>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning
import torch

from stallfree import Loader
from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

DATA, OUT = sys.argv[1], Path(sys.argv[2])


def loader() -> Loader:
    return Loader(DATA, batch_size=4, transform=[RandomResizedCrop(8), RandomHorizontalFlip(), Normalize()],
                  num_threads=1, seed=5, shuffle=True, columns=["index"])


whole, first, second = loader(), loader(), loader()  # before Lightning knows of ranks


class Recording(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3 * 8 * 8, 24)
        self.steps: list[tuple[list[int], float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels, extra = batch
        self.steps.append((extra["index"].tolist(), float(images.double().sum())))
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(name: str, data: Loader, ckpt_path: Path | None = None, **kwargs: Any) -> None:
    model = Recording()
    trainer = lightning.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=OUT / name, num_sanity_val_steps=0,
                                **kwargs)
    trainer.fit(model, train_dataloaders=data, ckpt_path=ckpt_path)
    (OUT / f"{name}-rank{trainer.global_rank}.json").write_text(json.dumps(model.steps))


fit("whole", whole, max_epochs=1, enable_checkpointing=False)
saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=OUT / "ckpt", filename="step1", every_n_train_steps=1)
fit("first", first, max_steps=1, callbacks=[saver])
fit("second", second, ckpt_path=OUT / "ckpt" / "step1.ckpt", max_epochs=1, enable_checkpointing=False)
