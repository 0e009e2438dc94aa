"""The one torch ``DataLoader`` baseline, so that every figure measured against it is comparable.

``bench loader``, ``bench train`` (through ``TorchFeed``) and ``profile --compare torch`` all run this one.

It decodes with PIL in ``workers`` processes and augments as a torchvision user writes it: for training
``RandomResizedCrop(size)``, ``RandomHorizontalFlip()``, ``ToTensor()``, ``Normalize(ImageNet mean, std)``; for
evaluation ``Resize(size * 256 // 224)``, ``CenterCrop(size)`` and the same two. When torchvision is importable
those are torchvision's own transforms; when it is not, a PIL stand-in draws the same crop window (torchvision's
``get_params`` formula) and resizes with PIL's bilinear filter. :func:`transform_label` says which one ran, and
every table that shows the baseline prints it.

Each sample's draws are keyed by ``(seed, epoch, index)``, not by a worker's generator, so that a resumed feed
repeats its pixels whatever the worker count.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["MEAN", "STD", "BaselineImages", "EpochKeyed", "torch_dataloader", "transform_label"]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def has_torchvision() -> bool:
    """Whether torchvision's own transforms run the baseline (found without importing it)."""
    return importlib.util.find_spec("torchvision") is not None


def transform_label() -> str:
    """How the baseline augments, for the tables that show it."""
    return "torchvision transforms" if has_torchvision() else "PIL stand-in for torchvision's transforms"


def _seed(seed: int, epoch: int, index: int) -> int:
    return int(np.random.SeedSequence((seed, epoch, index)).generate_state(1, np.uint64)[0] >> 1)


class _Torchvision:
    def __init__(self, size: int, train: bool):
        from torchvision import transforms as T

        head = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()] if train else \
            [T.Resize(size * 256 // 224), T.CenterCrop(size)]
        self.compose = T.Compose([*head, T.ToTensor(), T.Normalize(MEAN, STD)])

    def __call__(self, image: Any, seed: int) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):  # torchvision draws from torch's global generator
            torch.manual_seed(seed)
            result: torch.Tensor = self.compose(image)
            return result


class _PilStandIn:
    def __init__(self, size: int, train: bool):
        from stallfree.transforms import RandomResizedCrop  # DALI is an extra: the torchvision baseline needs none

        self.size, self.train, self.crop = size, train, RandomResizedCrop(size)

    def __call__(self, image: Any, seed: int) -> torch.Tensor:
        from PIL import Image

        from stallfree.transforms.random import SampleRandom  # likewise

        size = self.size
        if self.train:
            rng = SampleRandom(seed, 0, 0)
            top, left, h, w = self.crop.window(rng, image.height, image.width)
            image = image.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
            if rng.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            short = size * 256 // 224
            scale = short / min(image.width, image.height)
            resized = (max(short, round(image.width * scale)), max(short, round(image.height * scale)))
            image = image.resize(resized, Image.Resampling.BILINEAR)
            left, top = (image.width - size) // 2, (image.height - size) // 2
            image = image.crop((left, top, left + size, top + size))
        x = torch.from_numpy(np.asarray(image, np.uint8).copy()).permute(2, 0, 1).float().div_(255)
        return x.sub_(torch.tensor(MEAN)[:, None, None]).div_(torch.tensor(STD)[:, None, None])


class BaselineImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """``(path, label)`` files decoded with PIL and augmented by the baseline, keyed by ``(epoch, index)``."""

    def __init__(self, files: Sequence[tuple[str, int]], image_size: int, *, train: bool = True, seed: int = 0):
        self.files, self.size, self.train, self.seed = list(files), image_size, train, seed
        self.transform = (_Torchvision if has_torchvision() else _PilStandIn)(image_size, train)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        from PIL import Image

        epoch, index = key
        path, label = self.files[index]
        with Image.open(path) as img:
            image = img.convert("RGB")
        return self.transform(image, _seed(self.seed, epoch, index)), label


class EpochKeyed(torch.utils.data.Sampler[tuple[int, int]]):
    """``(epoch, index)`` keys from an index sampler that has an ``epoch`` (a ``DistributedSampler``).

    Persistent workers hold a copy of the dataset made when they started, so the epoch that keys the
    augmentation travels with each index instead of living on the dataset.
    """

    def __init__(self, inner: Any):
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = int(getattr(self.inner, "epoch", 0))
        return ((epoch, int(i)) for i in self.inner)


def torch_dataloader(files: Sequence[tuple[str, int]], *, batch_size: int, image_size: int, workers: int,
                     train: bool = True, seed: int = 0, sampler: Any = None, pin_memory: bool = False,
                     persistent: bool = False) -> torch.utils.data.DataLoader[Any]:
    """The baseline ``DataLoader`` over ``files`` in ``workers`` processes.

    Shuffled by ``seed`` (or in ``sampler``'s order, which must have an ``epoch``); the last partial batch is
    dropped when training.
    """
    data = torch.utils.data
    if sampler is None:
        sampler = data.DistributedSampler(range(len(files)), 1, 0,  # type: ignore[arg-type]  # any sized object
                                          shuffle=train, seed=seed, drop_last=False)
    return data.DataLoader(BaselineImages(files, image_size, train=train, seed=seed),
                           batch_size, sampler=EpochKeyed(sampler), drop_last=train, num_workers=workers,
                           pin_memory=pin_memory, persistent_workers=persistent and workers > 0,
                           prefetch_factor=2 if workers else None)
