"""The augmentation spec (torchvision names) and its compilation to DALI operators."""

from stallfree.transforms.color import ColorJitter
from stallfree.transforms.spec import (
    CenterCrop,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    Transform,
)

__all__ = [
    "ColorJitter",
    "CenterCrop",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "Transform",
]
