"""torchvision's photometric transforms (blur, sharpness, autocontrast, equalize, invert, ...) as graph steps.

``TRANSLATORS`` maps a torchvision class name to the function that turns one of its instances into a stallfree
step; ``from_torchvision`` consults it for the names it does not handle itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stallfree.transforms import spec

__all__ = ["TRANSLATORS"]

TRANSLATORS: dict[str, Callable[[str, Any], spec.Transform]] = {}
