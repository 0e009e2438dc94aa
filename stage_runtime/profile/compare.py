"""``stallfree profile --compare torch``: torch's DataLoader over the same files, PIL decode, same augmentation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["torch_dataloader"]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


class _PilDataset:
    """RandomResizedCrop + horizontal flip + normalize on PIL images, as a torchvision user would write it."""

    def __init__(self, paths: list[Path], labels: list[int], image_size: int, seed: int):
        from stallfree.transforms import RandomResizedCrop

        self.paths, self.labels, self.image_size, self.seed = paths, labels, image_size, seed
        self.crop = RandomResizedCrop(image_size)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch
        from PIL import Image

        from stallfree.transforms.random import SampleRandom

        rng = np.random.default_rng((self.seed, index))
        with Image.open(self.paths[index]) as img:
            img = img.convert("RGB")
            top, left, h, w = self.crop.window(SampleRandom(self.seed, 0, index), img.height, img.width)
            img = img.resize((self.image_size, self.image_size), Image.Resampling.BILINEAR,
                             box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        tensor = torch.from_numpy(np.asarray(img, np.uint8).copy()).permute(2, 0, 1).float().div_(255)
        tensor = tensor.sub_(torch.tensor(MEAN)[:, None, None]).div_(torch.tensor(STD)[:, None, None])
        return tensor, self.labels[index]


def torch_dataloader(paths: list[Path], labels: list[int], *, batch_size: int, image_size: int, workers: int,
                     seed: int = 0) -> Any:
    """A ``torch.utils.data.DataLoader`` with ``workers`` processes over the files, shuffled, last batch dropped."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    dataset: Any = _PilDataset(paths, labels, image_size, seed)  # a map-style Dataset by protocol
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size,
                                       shuffle=True, drop_last=True, num_workers=workers, generator=generator,
                                       prefetch_factor=2 if workers else None, persistent_workers=False)
