"""What feeds stage 0: the Loader, a torch DataLoader (``TorchFeed``, the baseline), or generated tensors.

The Loader or ``TorchFeed`` read a dataset folder; ``TensorBatches`` generates tensors when there is none. A token
model's job is fed packed sequences: the Loader's packs of a token source, or generated ones
(:mod:`.token_feed`).

All satisfy :class:`Feed`, the Loader's contract the trainer reads them through: iteration of batches (``(images,
labels)``, or the packed dicts; the job's task reads them, :mod:`stallfree.stage_runtime.models.tasks`), ``len``
(batches per epoch), ``set_epoch``, ``state_dict``/``load_state_dict`` counting batches delivered, and
``classes``. Training batches are full (``drop_last``): ``torch.distributed.pipelining`` needs the same micro-batch
shape every step. Pipeline rank 0 of each replica builds its :class:`Feeds` (:func:`build_feeds`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from stallfree.stage_runtime.baseline import MEAN, STD, BaselineImages, EpochKeyed, transform_label
from stallfree.stage_runtime.clock import StageClock
from stallfree.stage_runtime.config.train_config import TrainConfig, Verify
from stallfree.stage_runtime.train.augment import training_transform
from stallfree.stage_runtime.train.caption_feed import (
    CAPTION_VOCAB,
    CaptionBatches,
    image_text_packing,
    image_text_transform,
)
from stallfree.stage_runtime.train.feed_state import checked_position, next_epoch
from stallfree.stage_runtime.train.token_feed import (
    GENERATED_VOCAB,
    TokenBatches,
    data_vocab,
    packed_loader,
    packing,
)

__all__ = ["Feed", "Feeds", "TensorBatches", "TorchFeed", "build_feeds", "make_feed"]


@runtime_checkable
class Feed(Protocol):
    """What feeds stage 0, as the trainer reads it: the Loader, :class:`TorchFeed` and :class:`TensorBatches`."""

    @property
    def classes(self) -> list[str]:
        """Class names, index = label."""
        ...

    def __len__(self) -> int:
        """Batches per epoch."""
        ...

    def __iter__(self) -> Iterator[Any]:
        """The epoch's batches (``(images, labels)``, or packed dicts), from where ``set_epoch`` or a state put it."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order next."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered (JSON-able)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the last batch delivered when ``state`` was taken."""
        ...


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
        self.epoch, self._position = next_epoch(self.epoch, self._position, self._loaded, epoch)

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
        self.epoch, self._position = checked_position("TensorBatches", state, self.fingerprint(), len(self))
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
        from stallfree.pipeline.readers import FolderReader  # DALI is an extra: --synthetic trains without it

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
        self.epoch, self._position = next_epoch(self.epoch, self._position, self._loaded, epoch)

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
        self.epoch, self._position = checked_position("TorchFeed", state, self.fingerprint(), len(self))
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


@dataclass(frozen=True)
class Feeds:
    """Pipeline rank 0's feeds: the training feed and the held-out split's.

    ``clocked``: the training feed records its own input waits on the stage clock (the Loader, given the clock);
    the trainer records them for the others. ``held_out_samples``: how many of the samples the held-out feed
    delivers each epoch are its replica's own, before any padding (see :func:`_own_samples`). ``outputs``: what the
    model's last layer predicts among: the classes, or a token model's vocabulary.
    """

    train: Feed
    clocked: bool
    held_out: Feed | None
    held_out_samples: int
    outputs: int


def build_feeds(config: TrainConfig, replica: int, device: str, clock: StageClock) -> Feeds:
    """Replica ``replica``'s feeds of ``config``'s job: its training data, and held-out data if there are any.

    Generated tensors (no dataset) have a generated held-out split; a dataset has one when ``eval_data`` is given.
    """
    if config.model.kind == "tokens":
        return _token_feeds(config, replica, device, clock)
    f, p = config.feed, config.pipeline
    common: dict[str, Any] = {
        "batch_size": p.batch_size, "image_size": config.model.image_size, "seed": config.seed, "replica": replica,
        "replicas": p.dp, "samples": f.samples, "device": device, "num_classes": config.model.num_classes or 10,
        "kind": f.kind, "workers": f.loader_threads, "verify": f.verify,
    }
    train, _ = _feed(f.data, train=True, clock=clock, transform=f.transform, **common)
    held_out, own = _feed(f.eval_data, train=False, **common) if f.eval_data is not None or f.data is None else (
        None, 0)
    return Feeds(train, f.data is not None and f.kind == "stallfree", held_out, own,
                 config.model.num_classes or len(train.classes))


def _token_feeds(config: TrainConfig, replica: int, device: str, clock: StageClock) -> Feeds:
    """A token model's feeds: the Loader's packs of a token source, or generated sequences (:mod:`.token_feed`).

    The held-out split is ``eval_data``'s packs, every row counted; without it, generated sequences have a generated
    one (another ``split`` of rows, in order) and a token source none.
    """
    f, p, m = config.feed, config.pipeline, config.model
    if m.vision is not None:
        return _image_text_feeds(config, replica, device, clock)
    vocab = m.vocab_size or (GENERATED_VOCAB if f.data is None else data_vocab(f.data))
    generated: dict[str, Any] = {"batch_size": p.batch_size, "seq_len": m.packed_len, "vocab_size": vocab,
                                 "seed": config.seed, "rank": replica, "world_size": p.dp}
    common: dict[str, Any] = {"batch_size": p.batch_size, "seed": config.seed, "replica": replica, "replicas": p.dp,
                              "device": device, "workers": f.loader_threads, "verify": f.verify}
    train: Feed = (TokenBatches(f.samples, **generated) if f.data is None else
                   packed_loader(f.data, packing(config), train=True, clock=clock, **common))
    held_out: Feed | None = None
    own = sys.maxsize
    if f.eval_data is not None:
        held_out = packed_loader(f.eval_data, packing(config, train=False), train=False, clock=None, **common)
    elif f.data is None:
        held_out = TokenBatches(max(p.batch_size * p.dp, f.samples // 4), shuffle=False, split=1, **generated)
        own = len(held_out) * p.batch_size
    return Feeds(train, f.data is not None, held_out, own, vocab)


def _image_text_feeds(config: TrainConfig, replica: int, device: str, clock: StageClock) -> Feeds:
    """A vision model's feeds: the Loader's packs of an image-text source, or the generated caption task's.

    The image token's id is the text's vocabulary size; the Loader resizes the images to ``--image-size`` and
    normalizes them (:func:`.caption_feed.image_text_transform`).
    """
    f, p, m = config.feed, config.pipeline, config.model
    patch = m.vision or 0
    if f.data is None:
        generated: dict[str, Any] = {"batch_size": p.batch_size, "seq_len": m.packed_len, "image_size": m.image_size,
                                     "patch": patch, "seed": config.seed, "rank": replica, "world_size": p.dp}
        held_out = CaptionBatches(max(p.batch_size * p.dp, f.samples // 4), shuffle=False, split=1, **generated)
        return Feeds(CaptionBatches(f.samples, **generated), False, held_out, len(held_out) * p.batch_size,
                     CAPTION_VOCAB)
    vocab = m.vocab_size or data_vocab(f.data)
    common: dict[str, Any] = {"batch_size": p.batch_size, "seed": config.seed, "replica": replica, "replicas": p.dp,
                              "device": device, "workers": f.loader_threads, "verify": f.verify,
                              "transform": image_text_transform(m.image_size)}
    packs = image_text_packing(config, vocab)
    train = packed_loader(f.data, packs, train=True, clock=clock, **common)
    evaluation = (None if f.eval_data is None else
                  packed_loader(f.eval_data, packs, train=False, clock=None, **common))
    return Feeds(train, True, evaluation, sys.maxsize, vocab)


def make_feed(data: str | None, *, train: bool, batch_size: int, image_size: int, num_classes: int, seed: int,
              replica: int, replicas: int, samples: int, device: str, clock: StageClock | None = None,
              kind: str = "stallfree", workers: int | None = None, verify: Verify = "first-use",
              transform: str | None = None) -> Feed:
    """The training (``train=True``) or evaluation feed of one pipeline replica.

    ``data`` is an ImageFolder tree, a file list or an ingested shard folder read by the Loader (``kind`` is
    ``"stallfree"``, given ``clock``) or by torch's DataLoader (``"torch"``, ImageFolder only, ``workers``
    processes); ``None`` generates :class:`TensorBatches` (``samples`` of them; evaluation draws another split: a
    held-out set). ``verify`` is the Loader's: when a shard's SHA-256 is checked (``"first-use"``, ``"open"`` or
    ``"none"``). ``transform`` is ``--transform`` for the training feed (:func:`.augment.training_transform`;
    ``None``: the baseline's augmentation); evaluation always resizes and centre-crops.
    """
    return _feed(data, train=train, batch_size=batch_size, image_size=image_size, num_classes=num_classes, seed=seed,
                 replica=replica, replicas=replicas, samples=samples, device=device, clock=clock, kind=kind,
                 workers=workers, verify=verify, transform=transform)[0]


def _feed(data: str | None, *, train: bool, batch_size: int, image_size: int, num_classes: int, seed: int,
          replica: int, replicas: int, samples: int, device: str, clock: StageClock | None = None,
          kind: str = "stallfree", workers: int | None = None, verify: Verify = "first-use",
          transform: str | None = None) -> tuple[Feed, int]:
    """:func:`make_feed`'s feed, and how many of the samples it delivers each epoch are its own (no padding)."""
    if data is not None and kind == "torch":
        torch_feed = TorchFeed(data, batch_size, image_size, train=train, seed=seed, replica=replica,
                               replicas=replicas, workers=workers if workers is not None else 2)
        return torch_feed, _own_samples(len(torch_feed.dataset), replicas, replica)
    if kind not in ("stallfree", "torch"):
        raise ValueError(f"feed must be 'stallfree' or 'torch', got {kind!r}")
    if data is None:
        tensors = TensorBatches(samples if train else max(batch_size * replicas, samples // 4), batch_size,
                                image_size, num_classes, seed=seed, rank=replica, world_size=replicas,
                                shuffle=train, split=0 if train else 1)
        return tensors, len(tensors) * batch_size  # it drops the tail instead of padding
    from stallfree.pipeline.loader import Loader  # DALI is an extra: --synthetic trains without it
    from stallfree.transforms import CenterCrop, Normalize, Resize  # likewise

    # by default the baseline's augmentation, so that a run fed by torch's DataLoader does the same work per image
    steps = (training_transform(transform, image_size) if train else
             [Resize(image_size * 256 // 224), CenterCrop(image_size), Normalize(MEAN, STD)])
    loader = Loader(data, batch_size, transform=steps, shuffle=train, seed=seed, drop_last=train, rank=replica,
                    world_size=replicas, device=device, clock=clock, num_threads=workers, verify=verify)
    own = _own_samples(loader.sampler.total(), replicas, replica)
    # The training feed makes its first batches while the stages build their models (the first step's input wait).
    return (loader.start() if train else loader), own


def _own_samples(n: int, replicas: int, replica: int) -> int:
    """How many of an evaluation shard's samples are its own, of ``n`` over ``replicas``.

    An evaluation feed over ``W`` replicas pads every shard to ``ceil(n / W)`` samples with samples from the
    start (the Loader and ``DistributedSampler`` both), replica ``r`` taking positions ``r, r + W, ...``, so its
    padding is at its end and it has ``ceil((n - r) / W)`` samples of its own.
    """
    return max(0, -(-(n - replica) // replicas))
