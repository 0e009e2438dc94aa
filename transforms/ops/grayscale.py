"""``Grayscale``: torchvision's conversion to luma, with one or three output channels.

On uint8 images the luma is PIL's ``convert("L")`` (ITU-R 601-2 in 16-bit fixed point, rounded), which is what
``T.Grayscale`` computes on the PIL images ImageFolder gives; on float images (after ``Normalize``) it is
torchvision's tensor formula ``0.2989 R + 0.587 G + 0.114 B``. The three channels stay equal inside the graph
(every later step sees an RGB image, as the bundled kernels expect); with ``num_output_channels=1`` the output
stage keeps the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.transforms.numba.kernel import Kernel, KernelTransform, kernel
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size

__all__ = ["Grayscale"]

_WR, _WG, _WB = np.float32(0.2989), np.float32(0.587), np.float32(0.114)


@kernel(name="Grayscale[uint8]")
def _luma_pil(out: Any, image: Any, y: int, x: int, apply: Any) -> None:
    # PIL's L24 rule: L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16.
    v = (19595 * np.int32(image[y, x, 0]) + 38470 * np.int32(image[y, x, 1]) + 7471 * np.int32(image[y, x, 2])
         + 32768) >> 16
    for c in range(image.shape[2]):
        out[y, x, c] = v


@kernel(name="Grayscale[float32]")
def _luma_tensor(out: Any, image: Any, y: int, x: int, apply: Any) -> None:
    v = _WR * image[y, x, 0] + _WG * image[y, x, 1] + _WB * image[y, x, 2]
    for c in range(image.shape[2]):
        out[y, x, c] = v


@dataclass(frozen=True)
class Grayscale(KernelTransform):
    """Convert to grayscale (torchvision's ``Grayscale``); ``num_output_channels`` is 1 or 3."""

    num_output_channels: int = 1
    params = {"apply": np.int32}  # unused by the kernels; a kernel takes at least one parameter

    def __post_init__(self) -> None:
        if self.num_output_channels not in (1, 3):
            raise ValueError(
                f"Grayscale: num_output_channels should be either 1 or 3, got {self.num_output_channels!r}"
            )

    def kernel_for(self, state: GraphState) -> Kernel:
        return _luma_pil if state.dtype == "uint8" else _luma_tensor

    def sample(self, rng: SampleRandom, size: Size) -> Mapping[str, Any]:
        return {"apply": 1}
