"""What feeds stage 0: the Loader over a dataset folder, or generated tensors when there is no dataset.

Both share the Loader's contract the trainer relies on: iteration of ``(images, labels)``, ``len`` (batches
per epoch), ``set_epoch`` and ``state_dict``/``load_state_dict`` counting batches delivered. Training batches
are full (``drop_last``): ``torch.distributed.pipelining`` needs the same micro-batch shape every step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["TensorBatches", "make_feed"]


class TensorBatches:
    """A learnable generated dataset as batches: each class is a fixed random pattern, plus noise.

    Sample ``i`` of epoch ``e`` is the same tensor in every process (it is drawn from a generator keyed by
    ``(seed, e, i)``), so single-process and pipelined runs see identical data; ``rank``/``world_size`` shard
    the batches as the Loader does.
    """

    def __init__(self, num_samples: int, batch_size: int, image_size: int, num_classes: int, *, seed: int = 0,
                 rank: int = 0, world_size: int = 1, shuffle: bool = True, channels: int = 3, noise: float = 0.5,
                 split: int = 0):
        if num_samples < batch_size * world_size:
            raise ValueError(f"need at least one batch per replica: num_samples={num_samples}, "
                             f"batch_size={batch_size}, replicas={world_size}")
        self.num_samples, self.batch_size, self.image_size = num_samples, batch_size, image_size
        self.num_classes, self.seed, self.rank, self.world_size = num_classes, seed, rank, world_size
        self.shuffle, self.channels, self.noise, self.split = shuffle, channels, noise, split
        g = torch.Generator().manual_seed(seed + 7919)  # the classes' patterns: the same in every split
        self.patterns = torch.randn(num_classes, channels, image_size, image_size, generator=g)
        self.epoch, self._delivered, self._resume = 0, 0, 0

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        return [f"class{i}" for i in range(self.num_classes)]

    def __len__(self) -> int:
        return self.num_samples // (self.batch_size * self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order next."""
        if epoch != self.epoch:
            self._resume = 0
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Epoch and batches delivered (JSON-able)."""
        return {"epoch": self.epoch, "batches": self._delivered if self._resume == 0 else self._resume}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the last batch delivered when ``state`` was taken."""
        self.epoch, self._resume = int(state["epoch"]), int(state["batches"])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        start, self._resume = self._resume, 0
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.num_samples, generator=g) if self.shuffle else torch.arange(self.num_samples)
        for b in range(start, len(self)):
            first = (b * self.world_size + self.rank) * self.batch_size
            idx = order[first:first + self.batch_size]
            images, labels = zip(*(self._sample(int(i)) for i in idx), strict=True)
            self._delivered = b + 1
            yield torch.stack(images), torch.tensor(labels, dtype=torch.int64)

    def _sample(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed((self.seed * 7_777_777 + index) * 2 + self.split)
        label = int(torch.randint(self.num_classes, (1,), generator=g))
        noise = torch.randn(self.channels, self.image_size, self.image_size, generator=g)
        return self.patterns[label] + self.noise * noise, label


def make_feed(data: str | None, *, train: bool, batch_size: int, image_size: int, num_classes: int, seed: int,
              replica: int, replicas: int, samples: int, device: str, clock: Any = None) -> Any:
    """The training (``train=True``) or evaluation feed of one pipeline replica.

    ``data`` is an ImageFolder tree, a file list or an ingested shard folder read by the Loader; ``None``
    generates :class:`TensorBatches` (``samples`` of them; evaluation uses another seed: a held-out set).
    """
    if data is None:
        return TensorBatches(samples if train else max(batch_size * replicas, samples // 4), batch_size,
                             image_size, num_classes, seed=seed, rank=replica, world_size=replicas,
                             shuffle=train, split=0 if train else 1)
    from stallfree import Loader
    from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop, Resize

    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    if train:
        transform = [RandomResizedCrop(image_size, scale=(0.6, 1.0)), RandomHorizontalFlip(), Normalize(mean, std)]
    else:
        transform = [Resize(image_size), CenterCrop(image_size), Normalize(mean, std)]
    return Loader(data, batch_size, transform=transform, shuffle=train, seed=seed, drop_last=train, rank=replica,
                  world_size=replicas, device=device, clock=clock)
