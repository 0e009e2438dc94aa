"""Bundled models, each a flat ``nn.Sequential`` of layers so that the partitioner can cut it between any two.

The image models are here; ``gpt_tiny``, a token model, is :mod:`.gpt`'s, and ``vlm_tiny``, the same with a vision
stem for packed image-text sequences, :mod:`.vision`'s.

A pipeline stage is a contiguous run of these layers, so every layer takes one tensor and returns one tensor.
``resolve(name)`` turns a ``--model`` value into a factory: a bundled name (``MODELS``) or a user's
``package.module:factory`` that returns an ``nn.Sequential`` or a list of modules.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from stallfree.stage_runtime.factories import import_factory
from stallfree.stage_runtime.models.gpt import gpt_tiny
from stallfree.stage_runtime.models.vision import vlm_tiny

__all__ = ["MODELS", "build_model", "mlp", "resnet18", "resnet50", "resnet_cifar", "resolve", "small_cnn", "vit_small"]

Factory = Callable[..., nn.Module]


class _Basic(nn.Module):
    """ResNet basic block (two 3x3 convolutions) with its shortcut; one tensor in, one out."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


class _Bottleneck(nn.Module):
    """ResNet-50 bottleneck block (1x1, 3x3, 1x1 with 4x expansion) with its shortcut."""

    def __init__(self, cin: int, mid: int, stride: int):
        super().__init__()
        cout = mid * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


def _head(features: int, num_classes: int) -> list[nn.Module]:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(features, num_classes)]


def mlp(num_classes: int = 10, image_size: int = 32, hidden: int = 256, depth: int = 4, in_channels: int = 3,
        in_features: int | None = None) -> nn.Sequential:
    """Flatten, then ``depth`` Linear+ReLU layers of width ``hidden``, then the classifier.

    ``in_features`` overrides ``in_channels * image_size**2`` for inputs that are already flat.
    """
    width = in_features if in_features is not None else in_channels * image_size * image_size
    layers: list[nn.Module] = [nn.Flatten()]
    for _ in range(depth):
        layers.append(nn.Sequential(nn.Linear(width, hidden), nn.ReLU()))
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def small_cnn(num_classes: int = 10, image_size: int = 32, width: int = 16) -> nn.Sequential:
    """Four conv blocks and a classifier: the demo's CPU-sized model (about 30k parameters at width 16)."""
    del image_size  # global pooling makes the model size-agnostic

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU(inplace=True), nn.MaxPool2d(2))

    return nn.Sequential(block(3, width), block(width, 2 * width), block(2 * width, 4 * width),
                         block(4 * width, 4 * width), *_head(4 * width, num_classes))


def resnet_cifar(num_classes: int = 10, image_size: int = 32, blocks: int = 3, width: int = 16) -> nn.Sequential:
    """The CIFAR-size ResNet of He et al. (6n+2 layers; ``blocks=3`` is ResNet-20): 3 stages of widths w, 2w, 4w."""
    del image_size
    layers: list[nn.Module] = [nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                             nn.ReLU(inplace=True))]
    cin = width
    for i, cout in enumerate((width, 2 * width, 4 * width)):
        for j in range(blocks):
            layers.append(_Basic(cin, cout, 2 if i > 0 and j == 0 else 1))
            cin = cout
    return nn.Sequential(*layers, *_head(cin, num_classes))


def _imagenet_stem() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                         nn.MaxPool2d(3, 2, 1))


def resnet18(num_classes: int = 1000, image_size: int = 224) -> nn.Sequential:
    """ResNet-18 (He et al.), flattened to stem, 8 basic blocks and head."""
    del image_size
    layers: list[nn.Module] = [_imagenet_stem()]
    cin = 64
    for i, cout in enumerate((64, 128, 256, 512)):
        for j in range(2):
            layers.append(_Basic(cin, cout, 2 if i > 0 and j == 0 else 1))
            cin = cout
    return nn.Sequential(*layers, *_head(512, num_classes))


def resnet50(num_classes: int = 1000, image_size: int = 224) -> nn.Sequential:
    """ResNet-50 (He et al.), flattened to stem, 16 bottleneck blocks and head."""
    del image_size
    layers: list[nn.Module] = [_imagenet_stem()]
    cin = 64
    for i, (mid, count) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3))):
        for j in range(count):
            layers.append(_Bottleneck(cin, mid, 2 if i > 0 and j == 0 else 1))
            cin = mid * 4
    return nn.Sequential(*layers, *_head(2048, num_classes))


class _Patches(nn.Module):
    """Patch embedding plus learned position embedding: (B, 3, H, W) -> (B, N, D)."""

    def __init__(self, image_size: int, patch: int, dim: int):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size must be a multiple of patch, got image_size={image_size}, patch={patch}")
        self.proj = nn.Conv2d(3, dim, patch, patch)
        self.pos = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2, dim))
        nn.init.trunc_normal_(self.pos, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2) + self.pos  # (B, N, D)


class _MeanHead(nn.Module):
    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x).mean(dim=1))  # (B, N, D) -> (B, classes)


def vit_small(num_classes: int = 10, image_size: int = 32, patch: int = 4, dim: int = 128, depth: int = 6,
              heads: int = 4) -> nn.Sequential:
    """A small Vision Transformer (Dosovitskiy et al.) with mean pooling instead of a class token."""
    blocks = [nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True,
                                         norm_first=True) for _ in range(depth)]
    return nn.Sequential(_Patches(image_size, patch, dim), *blocks, _MeanHead(dim, num_classes))


def _gpt_tiny(num_classes: int = 256, image_size: int = 32, seq_len: int = 256, max_positions: int | None = None,
              **kwargs: int) -> nn.Sequential:
    """:func:`~.gpt.gpt_tiny` as the trainer builds it: ``num_classes`` is its vocabulary.

    Its position table holds at least the packed length (2048 positions by default).
    """
    del image_size
    return gpt_tiny(num_classes, max_positions=max_positions or max(2048, seq_len), **kwargs)


def _vlm_tiny(num_classes: int = 256, image_size: int = 32, seq_len: int = 256, max_positions: int | None = None,
              patch: int = 8, **kwargs: int) -> nn.Sequential:
    """:func:`~.vision.vlm_tiny` as the trainer builds it: ``num_classes`` is the text's vocabulary.

    Its images are ``image_size`` square, ``(image_size / patch)**2`` tokens each.
    """
    if image_size % patch:
        raise ValueError(f"vlm_tiny: --image-size {image_size} must be a multiple of --patch {patch}")
    return vlm_tiny(num_classes, max_positions=max_positions or max(2048, seq_len), patch=patch, **kwargs)


MODELS: dict[str, Factory] = {
    "mlp": mlp, "small_cnn": small_cnn, "resnet_cifar": resnet_cifar, "resnet18": resnet18, "resnet50": resnet50,
    "vit_small": vit_small, "gpt_tiny": _gpt_tiny, "vlm_tiny": _vlm_tiny,
}


def resolve(name: str) -> Factory:
    """The factory behind a ``--model`` value (a bundled name or ``package.module:factory``).

    Raises:
        ValueError: unknown name, or the import fails.
    """
    if name in MODELS:
        return MODELS[name]
    if ":" not in name:
        raise ValueError(f"unknown model {name!r}: use one of {sorted(MODELS)} or 'package.module:factory'")
    return import_factory(name, "--model")


def build_model(name: str, num_classes: int, image_size: int, **kwargs: object) -> nn.Sequential:
    """Build ``name`` (bundled or ``package.module:factory``) as an ``nn.Sequential``.

    Bundled factories get ``num_classes`` and ``image_size``; a user's factory gets them too when its signature
    accepts them. A list of modules is wrapped in an ``nn.Sequential``.

    Raises:
        ValueError: unknown name, import failure, or a factory that returns something other than layers.
    """
    factory = resolve(name)
    try:
        model = factory(num_classes=num_classes, image_size=image_size, **kwargs)
    except TypeError:
        if name in MODELS:
            raise
        model = factory(**kwargs)
    if isinstance(model, (list, tuple)):
        model = nn.Sequential(*model)
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"--model {name!r} returned {type(model).__name__}; the trainer splits an nn.Sequential "
                         "or a list of modules between layers, so return one of those")
    return model
