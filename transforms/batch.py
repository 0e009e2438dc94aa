"""Batch-level ``MixUp`` and ``CutMix`` (torchvision v2 semantics) on the Loader's output tensors, on their device.

Both pair each sample with its neighbour in the batch (``batch.roll(1, 0)``, as torchvision does) and mix the
one-hot labels by the same proportion, so the targets become soft. The mixing proportion (and CutMix's box) is a
pure function of ``(seed, epoch, batch index)``: a training run that resumes at batch ``k`` of epoch ``e`` mixes
exactly as the uninterrupted run did, and the whole state is those three numbers.

    mix = MixUp(alpha=0.2, num_classes=10, seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch); mix.set_epoch(epoch)
        for images, labels in loader:
            images, targets = mix(images, labels)        # targets: (batch, num_classes) float
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from stallfree.core.resume import check_fingerprint, state_int, state_mapping

__all__ = ["CutMix", "MixUp"]

_MIXUP, _CUTMIX = 0x4D495855, 0x4355544D  # stream tags, so MixUp and CutMix with one seed draw independently


class _BatchMix:
    """Shared checks, the (seed, epoch, batch)-keyed generator and the resumable batch counter."""

    _tag = 0

    def __init__(self, *, alpha: float = 1.0, num_classes: int, seed: int = 0):
        if not alpha > 0 or not math.isfinite(alpha):
            raise ValueError(f"{type(self).__name__}: alpha must be a positive number, got alpha={alpha}")
        if not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"{type(self).__name__}: num_classes must be a positive int, got {num_classes!r}")
        self.alpha, self.num_classes, self.seed = float(alpha), num_classes, int(seed)
        self.epoch, self.batch, self._loaded = 0, 0, False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha}, num_classes={self.num_classes}, seed={self.seed})"

    def set_epoch(self, epoch: int) -> None:
        """Mix as epoch ``epoch`` does, from its first batch (from the loaded batch, if a state of it is loaded)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if not (self._loaded and epoch == self.epoch):
            self.epoch, self.batch = int(epoch), 0

    def fingerprint(self) -> dict[str, Any]:
        """What decides every draw; a state taken with another fingerprint is refused."""
        return {"kind": type(self).__name__, "seed": self.seed, "alpha": self.alpha, "num_classes": self.num_classes}

    def state_dict(self) -> dict[str, Any]:
        """``{"seed", "epoch", "batch", "fingerprint"}``: the next call mixes batch ``batch`` of ``epoch``."""
        return {"seed": self.seed, "epoch": self.epoch, "batch": self.batch, "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s output.

        Raises:
            ValueError: the state was taken with another seed, alpha or class count (named), or a field is
                missing, of another type or negative (named).
        """
        name = type(self).__name__
        checked = state_mapping(name, state)
        check_fingerprint(name, checked.get("fingerprint"), self.fingerprint())
        self.epoch, self.batch = state_int(name, checked, "epoch"), state_int(name, checked, "batch")
        self._loaded = True

    def generator(self, epoch: int, batch: int) -> np.random.Generator:
        """The generator of batch ``batch`` of ``epoch``: PCG64 seeded by ``(seed, tag, epoch, batch)``."""
        return np.random.default_rng([self.seed & 0xFFFFFFFFFFFFFFFF, self._tag, epoch, batch])

    def _check(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        name = type(self).__name__
        if images.ndim != 4:
            raise ValueError(f"{name}: images must be a 4-D (batch, ...) image tensor, got shape {tuple(images.shape)}")
        if labels.ndim != 1 or labels.shape[0] != images.shape[0] or labels.dtype != torch.int64:
            raise ValueError(
                f"{name}: labels must be int64 of shape ({images.shape[0]},), got {labels.dtype} {tuple(labels.shape)}"
            )
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError(f"{name}: labels must lie in [0, {self.num_classes}), got {labels.min()}..{labels.max()}")
        if not images.is_floating_point():
            raise ValueError(f"{name}: images must be floating point (mixing needs fractions), got {images.dtype}")

    def _next(self, batch: int | None) -> tuple[int, int]:
        index = self.batch if batch is None else int(batch)
        self.batch, self._loaded = index + 1, False
        return self.epoch, index

    def _targets(self, labels: torch.Tensor, lam: float, dtype: torch.dtype) -> torch.Tensor:
        one_hot = torch.nn.functional.one_hot(labels, self.num_classes).to(dtype)
        return one_hot.roll(1, 0).mul_(1.0 - lam).add_(one_hot.mul(lam))


class MixUp(_BatchMix):
    """``lam * x + (1 - lam) * x.roll(1)`` with ``lam ~ Beta(alpha, alpha)`` per batch (torchvision v2 ``MixUp``).

    Args:
        alpha: the Beta distribution's concentration.
        num_classes: label count, for the one-hot targets.
        seed: with the epoch and the batch index, determines every ``lam``.

    Call it on ``(images, labels)``: images ``(B, C, H, W)`` float on any device, labels int64 ``(B,)``. It returns
    the mixed images and soft targets ``(B, num_classes)`` of the images' dtype. ``batch=`` mixes a given batch
    index; by default the instance counts batches since :meth:`set_epoch` (or :meth:`load_state_dict`).
    """

    _tag = _MIXUP

    def lam(self, epoch: int, batch: int) -> float:
        """The mixing proportion of batch ``batch`` of ``epoch``."""
        return float(self.generator(epoch, batch).beta(self.alpha, self.alpha))

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, *, batch: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(images, labels)
        lam = self.lam(*self._next(batch))
        mixed = images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam))
        return mixed, self._targets(labels, lam, images.dtype)


class CutMix(_BatchMix):
    """Paste a box of ``x.roll(1)`` into ``x`` (torchvision v2 ``CutMix``); labels mix by the box's area.

    ``lam ~ Beta(alpha, alpha)``; the box is centred on a uniform pixel with half sides ``int(0.5 * sqrt(1 - lam)
    * W)`` and ``... * H``, clipped to the image, and the labels mix by ``1 - box area / image area``. Arguments and
    call as :class:`MixUp`, plus ``layout``: ``"NCHW"`` (also right for channels_last tensors) or ``"NHWC"``.
    """

    _tag = _CUTMIX

    def __init__(self, *, alpha: float = 1.0, num_classes: int, seed: int = 0, layout: str = "NCHW"):
        super().__init__(alpha=alpha, num_classes=num_classes, seed=seed)
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"CutMix: layout must be 'NCHW' or 'NHWC', got {layout!r}")
        self.layout = layout

    def box(self, epoch: int, batch: int, height: int, width: int) -> tuple[tuple[int, int, int, int], float]:
        """``(x1, y1, x2, y2)`` of batch ``batch`` of ``epoch``, and the label proportion it leaves."""
        rng = self.generator(epoch, batch)
        lam = float(rng.beta(self.alpha, self.alpha))
        r_x, r_y = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = 0.5 * math.sqrt(1.0 - lam)
        r_w_half, r_h_half = int(r * width), int(r * height)
        x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
        x2, y2 = min(r_x + r_w_half, width), min(r_y + r_h_half, height)
        return (x1, y1, x2, y2), 1.0 - (x2 - x1) * (y2 - y1) / (width * height)

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, *, batch: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self._check(images, labels)
        view = images.permute(0, 3, 1, 2) if self.layout == "NHWC" else images  # (B, C, H, W)
        (x1, y1, x2, y2), lam = self.box(*self._next(batch), view.shape[-2], view.shape[-1])
        mixed = images.clone()
        mixed_view = mixed.permute(0, 3, 1, 2) if self.layout == "NHWC" else mixed
        mixed_view[..., y1:y2, x1:x2] = view.roll(1, 0)[..., y1:y2, x1:x2]
        return mixed, self._targets(labels, lam, images.dtype)
