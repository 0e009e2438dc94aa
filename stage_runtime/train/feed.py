"""What feeds stage 0: the Loader, a torch DataLoader (``TorchFeed``, the baseline), or generated tensors.

The Loader or ``TorchFeed`` read a dataset folder; ``TensorBatches`` generates tensors when there is none.

All share the Loader's contract the trainer relies on: iteration of ``(images, labels)``, ``len`` (batches
per epoch), ``set_epoch`` and ``state_dict``/``load_state_dict`` counting batches delivered. Training batches
are full (``drop_last``): ``torch.distributed.pipelining`` needs the same micro-batch shape every step.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import torch

from stallfree.core.resume import check_fingerprint, state_int, state_mapping
from stallfree.stage_runtime.baseline import transform_label
from stallfree.stage_runtime.config.train_config import Verify

__all__ = ["TensorBatches", "TorchFeed", "make_feed", "unpadded_samples"]


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
        self.epoch, self._position, self._loaded = 0, 0, False

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        return [f"class{i}" for i in range(self.num_classes)]

    def __len__(self) -> int:
        return self.num_samples // (self.batch_size * self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order next, from its first batch (from the loaded batch if a state of it is loaded)."""
        self.epoch, self._position = _next_epoch(self.epoch, self._position, self._loaded, epoch)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order and the pixels."""
        return {"kind": "TensorBatches", "num_samples": self.num_samples, "batch_size": self.batch_size,
                "image_size": self.image_size, "num_classes": self.num_classes, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "shuffle": self.shuffle, "channels": self.channels,
                "noise": self.noise, "split": self.split}

    def state_dict(self) -> dict[str, Any]:
        """Epoch and batches delivered in it (JSON-able), with the fingerprint."""
        return {"epoch": self.epoch, "batches": self._position, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the last batch delivered when ``state`` was taken.

        Raises:
            ValueError: another fingerprint, or a field missing, of another type or out of range (named).
        """
        self.epoch, self._position = _checked("TensorBatches", state, self.fingerprint(), len(self))
        self._loaded = True

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._loaded = False
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.num_samples, generator=g) if self.shuffle else torch.arange(self.num_samples)
        for b in range(self._position, len(self)):
            first = (b * self.world_size + self.rank) * self.batch_size
            idx = order[first:first + self.batch_size]
            images, labels = zip(*(self._sample(int(i)) for i in idx), strict=True)
            self._position = b + 1
            yield torch.stack(images), torch.tensor(labels, dtype=torch.int64)
        self.epoch, self._position = self.epoch + 1, 0

    def _sample(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed((self.seed * 7_777_777 + index) * 2 + self.split)
        label = int(torch.randint(self.num_classes, (1,), generator=g))
        noise = torch.randn(self.channels, self.image_size, self.image_size, generator=g)
        return self.patterns[label] + self.noise * noise, label


class TorchFeed:
    """The baseline torch ``DataLoader`` over an ImageFolder, behind the feed contract: the benchmark's rival.

    The DataLoader and its augmentation are :mod:`stallfree.stage_runtime.baseline`'s.

    Resume restarts the epoch's iteration and skips the batches already delivered (the DataLoader has no
    cursor of its own).
    """

    def __init__(self, root: str, batch_size: int, image_size: int, *, train: bool, seed: int, replica: int,
                 replicas: int, workers: int):
        from stallfree.pipeline.readers import FolderReader
        from stallfree.stage_runtime.baseline import BaselineImages, EpochKeyed

        reader = FolderReader(root)
        files = [(str(p), int(y)) for p, y in zip(reader.paths, reader.labels(), strict=True)]
        self.dataset = BaselineImages(files, image_size, train=train, seed=seed)
        data = torch.utils.data
        self.sampler: data.DistributedSampler[Any] = data.DistributedSampler(
            self.dataset, replicas, replica, shuffle=train, seed=seed, drop_last=train)
        self.loader: data.DataLoader[Any] = data.DataLoader(
            self.dataset, batch_size, sampler=EpochKeyed(self.sampler), drop_last=train, num_workers=workers,
            persistent_workers=workers > 0)
        self.batch_size, self.classes = batch_size, reader.classes
        self.epoch, self._position, self._loaded = 0, 0, False

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order next, from its first batch (from the loaded batch if a state of it is loaded)."""
        self.epoch, self._position = _next_epoch(self.epoch, self._position, self._loaded, epoch)

    def fingerprint(self) -> dict[str, Any]:
        """What decides the order and the pixels: the files and labels, the augmentation and the shard."""
        digest = hashlib.sha256(json.dumps(self.dataset.files).encode()).hexdigest()
        return {"kind": "TorchFeed", "files": digest, "batch_size": self.batch_size, "image_size": self.dataset.size,
                "train": self.dataset.train, "seed": self.dataset.seed, "transform": transform_label(),
                "replica": self.sampler.rank, "replicas": self.sampler.num_replicas}

    def state_dict(self) -> dict[str, Any]:
        """Epoch and batches delivered in it (JSON-able), with the fingerprint."""
        return {"epoch": self.epoch, "batches": self._position, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Skip to after the batches delivered when ``state`` was taken.

        Raises:
            ValueError: another fingerprint, or a field missing, of another type or out of range (named).
        """
        self.epoch, self._position = _checked("TorchFeed", state, self.fingerprint(), len(self))
        self._loaded = True

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._loaded = False
        self.sampler.set_epoch(self.epoch)
        skip = self._position
        for i, batch in enumerate(self.loader):
            if i >= skip:
                self._position = i + 1
                yield batch
        self.epoch, self._position = self.epoch + 1, 0


def _checked(owner: str, state: object, fingerprint: dict[str, Any], batches: int) -> tuple[int, int]:
    """A feed state's ``(epoch, batches)``, once its fingerprint is this feed's and each field is in range."""
    state = state_mapping(owner, state)
    check_fingerprint(owner, state.get("fingerprint"), fingerprint)
    return state_int(owner, state, "epoch"), state_int(owner, state, "batches", high=batches,
                                                        why=" (the batches of an epoch)")


def _next_epoch(epoch: int, position: int, loaded: bool, new: int) -> tuple[int, int]:
    """``(epoch, position)`` after ``set_epoch(new)``: a loaded position survives setting its own epoch."""
    if new < 0:
        raise ValueError(f"epoch must be >= 0, got {new}")
    return int(new), position if loaded and new == epoch else 0


def make_feed(data: str | None, *, train: bool, batch_size: int, image_size: int, num_classes: int, seed: int,
              replica: int, replicas: int, samples: int, device: str, clock: Any = None,
              kind: str = "stallfree", workers: int | None = None, verify: Verify = "first-use",
              transform: str | None = None) -> Any:
    """The training (``train=True``) or evaluation feed of one pipeline replica.

    ``data`` is an ImageFolder tree, a file list or an ingested shard folder read by the Loader (``kind`` is
    ``"stallfree"``) or by torch's DataLoader (``"torch"``, ImageFolder only, ``workers`` processes); ``None``
    generates :class:`TensorBatches` (``samples`` of them; evaluation draws another split: a held-out set).
    ``verify`` is the Loader's: when a shard's SHA-256 is checked (``"first-use"``, ``"open"`` or ``"none"``).
    ``transform`` is ``--transform`` for the training feed (:func:`.augment.training_transform`; ``None``: the
    baseline's augmentation); evaluation always resizes and centre-crops.
    """
    if data is not None and kind == "torch":
        return TorchFeed(data, batch_size, image_size, train=train, seed=seed, replica=replica, replicas=replicas,
                         workers=workers if workers is not None else 2)
    if kind not in ("stallfree", "torch"):
        raise ValueError(f"feed must be 'stallfree' or 'torch', got {kind!r}")
    if data is None:
        return TensorBatches(samples if train else max(batch_size * replicas, samples // 4), batch_size,
                             image_size, num_classes, seed=seed, rank=replica, world_size=replicas,
                             shuffle=train, split=0 if train else 1)
    from stallfree.pipeline.loader import Loader
    from stallfree.stage_runtime.baseline import MEAN, STD
    from stallfree.stage_runtime.train.augment import training_transform
    from stallfree.transforms import CenterCrop, Normalize, Resize

    # by default the baseline's augmentation, so that a run fed by torch's DataLoader does the same work per image
    steps = (training_transform(transform, image_size) if train else
             [Resize(image_size * 256 // 224), CenterCrop(image_size), Normalize(MEAN, STD)])
    loader = Loader(data, batch_size, transform=steps, shuffle=train, seed=seed, drop_last=train, rank=replica,
                    world_size=replicas, device=device, clock=clock, num_threads=workers, verify=verify)
    # The training feed makes its first batches while the stages build their models (the first step's input wait).
    return loader.start() if train else loader


def unpadded_samples(feed: Any) -> int:
    """How many of the samples ``feed`` delivers this epoch are its own, before any padding.

    An evaluation feed over ``W`` replicas pads every shard to ``ceil(n / W)`` samples with samples from the
    start (the Loader and ``DistributedSampler`` both), replica ``r`` taking positions ``r, r + W, ...``, so its
    padding is at its end and it has ``ceil((n - r) / W)`` samples of its own. :class:`TensorBatches` drops the
    tail instead of padding.
    """
    if isinstance(feed, TensorBatches):
        return len(feed) * feed.batch_size
    if isinstance(feed, TorchFeed):
        n, world, rank = len(feed.dataset), feed.sampler.num_replicas, feed.sampler.rank
    else:  # the Loader
        n, world, rank = feed.sampler.num_virtual, feed.sampler.world_size, feed.sampler.rank
    return max(0, -(-(n - rank) // world))
