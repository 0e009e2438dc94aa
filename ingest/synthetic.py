"""The built-in synthetic dataset: labelled JPEGs that a small CNN can learn, made on the spot.

Each class is a shape (circle, square, triangle, cross, ring, bar, diamond, dot grid) drawn in a random colour, at a
random position and scale, over a noisy background of another random colour. The label is the shape, never the
colour, so a model must look at geometry to beat chance.

``style="natural"`` (the benchmarks' data) paints the background and the shape with textures that have natural
images' second-order statistics instead of flat colour: a power-law amplitude spectrum ``1/f**1.25`` (photographs
measure 1/f**0.8 to 1/f**1.5) with random phase, luminance and colour-opponent channels correlated as in
photographs, and a little sensor noise. At 375x500 and JPEG quality 90 a file is about 73 KiB, near an ImageNet
photo's size and decode cost. The flat style's white noise makes files of a similar size, but with no spatial
structure: its spectrum is flat where a photograph's falls off.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["SHAPES", "STYLES", "draw_shape", "make_image_folder"]

SHAPES = ("circle", "square", "triangle", "cross", "ring", "bar", "diamond", "grid")
STYLES = ("shapes", "natural")
_SPECTRUM_SLOPE = 1.25


@functools.lru_cache(maxsize=8)
def _amplitude(gh: int, gw: int) -> np.ndarray:
    """The ``1/f**_SPECTRUM_SLOPE`` amplitude on a ``(gh, gw)`` FFT grid, zero at DC (computed once per grid)."""
    f = np.hypot(np.fft.fftfreq(gh)[:, None], np.fft.fftfreq(gw)[None, :])
    f[0, 0] = 1.0
    amplitude = (f ** -_SPECTRUM_SLOPE).astype(np.float32)
    amplitude[0, 0] = 0.0
    return amplitude


def _power_law_fields(rng: np.random.Generator, h: int, w: int, count: int) -> list[np.ndarray]:
    """``count`` independent ``(h, w)`` fields with amplitude spectrum ``1/f**_SPECTRUM_SLOPE``, each of unit std.

    Complex Gaussian noise shaped by the spectrum gives, through one inverse FFT, two independent real fields (its
    real and imaginary parts). The grid is a power of two (numpy's FFT is many times slower on images' odd sides),
    cropped to ``(h, w)``.
    """
    gh, gw = (1 << (side - 1).bit_length() for side in (h, w))
    amplitude = _amplitude(gh, gw)
    fields: list[np.ndarray] = []
    while len(fields) < count:
        noise = np.empty((gh, gw), np.complex64)
        noise.real = rng.standard_normal((gh, gw), dtype=np.float32)
        noise.imag = rng.standard_normal((gh, gw), dtype=np.float32)
        noise *= amplitude
        both = np.fft.ifft2(noise)[:h, :w]
        fields += [(part - part.mean()) / part.std() for part in (both.real, both.imag)]
    return fields[:count]


def _natural_texture(rng: np.random.Generator, fields: list[np.ndarray]) -> np.ndarray:
    """An ``(h, w, 3)`` float RGB texture from three fields: luminance plus weaker colour-opponent channels."""
    lum, c1, c2 = fields
    opponent = 0.35 * np.stack([c1, 0.5 * (c2 - c1), -c2], axis=-1)
    return rng.uniform(60, 190, 3) + rng.uniform(25, 55) * (lum[..., None] + opponent)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, colour: tuple | int) -> None:
    """Draw ``shape`` (one of :data:`SHAPES`) of radius ``r`` centred at ``(cx, cy)`` in ``colour``."""
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
    style: str = "shapes",
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
        style: ``"shapes"`` (flat colours: small, fast, what the demo and tests learn from) or ``"natural"``
            (power-law textures with photographs' spectrum and file size: what the benchmarks decode).

    Raises:
        ValueError: for a class count outside ``1..len(SHAPES)``, a non-positive count or size, an unknown style.
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
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
            if style == "natural":
                r = rng.uniform(0.2, 0.35) * min(h, w)
                cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
                fields = _power_law_fields(rng, h, w, 6)
                pixels = _natural_texture(rng, fields[:3])
                mask = Image.new("L", (w, h), 0)
                draw_shape(ImageDraw.Draw(mask), shape, cx, cy, r, 255)
                inside = np.asarray(mask, dtype=bool)
                pixels[inside] = _natural_texture(rng, fields[3:])[inside]
                pixels += rng.normal(0, 1.0, (h, w, 3))
                image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
            else:
                background = rng.integers(0, 256, 3)
                noise = rng.normal(0, 12, (h, w, 3))
                image = Image.fromarray(np.clip(background + noise, 0, 255).astype(np.uint8), "RGB")
                colour = tuple(int(c) for c in (background + 128 + rng.integers(-60, 60, 3)) % 256)
                r = rng.uniform(0.2, 0.35) * min(h, w)
                cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
                draw_shape(ImageDraw.Draw(image), shape, cx, cy, r, colour)
            image.save(folder / f"{label}_{i:05d}.jpg", "JPEG", quality=quality)
    return root
