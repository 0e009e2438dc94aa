"""The built-in synthetic dataset: labelled JPEGs that a small CNN can learn, made on the spot.

Each class is a shape (circle, square, triangle, cross, ring, bar, diamond, dot grid) drawn in a random colour, at a
random position and scale, over a noisy background of another random colour. The label is the shape, never the
colour, so a model must look at geometry to beat chance.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["SHAPES", "make_image_folder"]

SHAPES = ("circle", "square", "triangle", "cross", "ring", "bar", "diamond", "grid")


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, colour: tuple) -> None:
    box = (cx - r, cy - r, cx + r, cy + r)
    width = max(1, int(r / 3))
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    elif shape == "cross":
        draw.line([(cx - r, cy), (cx + r, cy)], fill=colour, width=width)
        draw.line([(cx, cy - r), (cx, cy + r)], fill=colour, width=width)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=width)
    elif shape == "bar":
        draw.rectangle((cx - r, cy - r / 4, cx + r, cy + r / 4), fill=colour)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)
    else:  # grid: a 3x3 array of dots
        d = r / 3
        for gx in (-1, 0, 1):
            for gy in (-1, 0, 1):
                x, y = cx + gx * 2 * d, cy + gy * 2 * d
                draw.ellipse((x - d / 2, y - d / 2, x + d / 2, y + d / 2), fill=colour)


def make_image_folder(
    root: str | os.PathLike[str],
    *,
    num_classes: int = 4,
    per_class: int = 50,
    size: tuple[int, int] = (64, 64),
    seed: int = 0,
    quality: int = 90,
    vary_size: bool = False,
) -> Path:
    """Write a synthetic ImageFolder tree of JPEGs (``root/<shape>/<index>.jpg``) and return ``root``.

    Args:
        root: folder to create (it may exist; existing files of the same names are overwritten).
        num_classes: how many shapes, 1 to ``len(SHAPES)``.
        per_class: images per class.
        size: ``(height, width)`` of each image; with ``vary_size`` each image's sides vary from 75% to 125% of it.
        seed: the same seed writes the same bytes.
        quality: JPEG quality.
        vary_size: give images different sizes, as real datasets have.

    Raises:
        ValueError: for a class count outside ``1..len(SHAPES)``, a non-positive count or size.
    """
    if not 1 <= num_classes <= len(SHAPES):
        raise ValueError(f"num_classes must be in 1..{len(SHAPES)}, got {num_classes}")
    if per_class < 1:
        raise ValueError(f"per_class must be positive, got {per_class}")
    if len(size) != 2 or min(size) < 8:
        raise ValueError(f"size must be (height, width) with both sides >= 8, got {size}")
    rng = np.random.default_rng(seed)
    root = Path(root)
    for label, shape in enumerate(SHAPES[:num_classes]):
        folder = root / shape
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            h, w = size
            if vary_size:
                h, w = (int(s * rng.uniform(0.75, 1.25)) for s in size)
            background = rng.integers(0, 256, 3)
            noise = rng.normal(0, 12, (h, w, 3))
            pixels = np.clip(background + noise, 0, 255).astype(np.uint8)
            image = Image.fromarray(pixels, "RGB")
            colour = tuple(int(c) for c in (background + 128 + rng.integers(-60, 60, 3)) % 256)
            r = rng.uniform(0.2, 0.35) * min(h, w)
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
            _draw_shape(ImageDraw.Draw(image), shape, cx, cy, r, colour)
            image.save(folder / f"{label}_{i:05d}.jpg", "JPEG", quality=quality)
    return root
