"""The augmentation spec (torchvision names) and its compilation to DALI operators."""

from stallfree.core.dali import require_dali

require_dali()  # before the modules that import DALI: without it, one line naming the extra, not a deep traceback

from stallfree.transforms.adjust import (
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomInvert,
)
from stallfree.transforms.augmix import AugMix
from stallfree.transforms.batch import CutMix, MixUp
from stallfree.transforms.blur import GaussianBlur
from stallfree.transforms.bundled import (
    Cutout,
    GaussianNoise,
    Posterize,
    RandomErasing,
    RandomGrayscale,
    RandomPosterize,
    RandomSolarize,
    Solarize,
)
from stallfree.transforms.color import ColorJitter, RandomChannelPermutation, RandomPhotometricDistort
from stallfree.transforms.compose import Compose
from stallfree.transforms.containers import RandomApply, RandomChoice, RandomOrder
from stallfree.transforms.geometry import Pad, RandomCrop, RandomZoomOut
from stallfree.transforms.grayscale import Grayscale
from stallfree.transforms.jpeg import JPEG
from stallfree.transforms.numba.kernel import Kernel, KernelError, KernelTransform, kernel, normal_at, uniform_at
from stallfree.transforms.policies import AutoAugment, RandAugment, TrivialAugmentWide
from stallfree.transforms.rescale import RandomResize, RandomShortestSize, ScaleJitter
from stallfree.transforms.spec import (
    CenterCrop,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
    Resize,
    Transform,
)
from stallfree.transforms.warp import RandomAffine, RandomPerspective, RandomRotation

__all__ = [
    "AugMix",
    "AutoAugment",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "Cutout",
    "GaussianBlur",
    "GaussianNoise",
    "Grayscale",
    "JPEG",
    "Kernel",
    "KernelError",
    "KernelTransform",
    "MixUp",
    "Normalize",
    "Pad",
    "Posterize",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomApply",
    "RandomAutocontrast",
    "RandomChannelPermutation",
    "RandomChoice",
    "RandomCrop",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomOrder",
    "RandomPerspective",
    "RandomPhotometricDistort",
    "RandomPosterize",
    "RandomResize",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomShortestSize",
    "RandomSolarize",
    "RandomVerticalFlip",
    "RandomZoomOut",
    "Resize",
    "ScaleJitter",
    "Solarize",
    "Transform",
    "TrivialAugmentWide",
    "kernel",
    "normal_at",
    "uniform_at",
]
