"""The augmentation spec (torchvision names) and its compilation to DALI operators."""

from stallfree.core.dali import require_dali

require_dali()  # before the modules that import DALI: without it, one line naming the extra, not a deep traceback

from stallfree.transforms.batch import CutMix, MixUp
from stallfree.transforms.numba.kernel import Kernel, KernelError, KernelTransform, kernel, normal_at, uniform_at
from stallfree.transforms.ops.adjust import (
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomInvert,
)
from stallfree.transforms.ops.augmix import AugMix
from stallfree.transforms.ops.blur import GaussianBlur
from stallfree.transforms.ops.bundled import (
    Cutout,
    GaussianNoise,
    Posterize,
    RandomErasing,
    RandomGrayscale,
    RandomPosterize,
    RandomSolarize,
    Solarize,
)
from stallfree.transforms.ops.color import ColorJitter, RandomChannelPermutation, RandomPhotometricDistort
from stallfree.transforms.ops.compose import Compose
from stallfree.transforms.ops.containers import RandomApply, RandomChoice, RandomOrder
from stallfree.transforms.ops.flip import RandomHorizontalFlip, RandomVerticalFlip
from stallfree.transforms.ops.geometry import CenterCrop, Pad, RandomCrop, RandomZoomOut
from stallfree.transforms.ops.grayscale import Grayscale
from stallfree.transforms.ops.jpeg import JPEG
from stallfree.transforms.ops.normalize import Normalize
from stallfree.transforms.ops.policies import AutoAugment, RandAugment, TrivialAugmentWide
from stallfree.transforms.ops.rescale import RandomResize, RandomShortestSize, ScaleJitter
from stallfree.transforms.ops.resize import RandomResizedCrop, Resize
from stallfree.transforms.ops.warp import RandomAffine, RandomPerspective, RandomRotation
from stallfree.transforms.spec import Transform

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
