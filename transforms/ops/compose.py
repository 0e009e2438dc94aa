"""``Compose``: a spec as one object, as torchvision's ``Compose`` holds a pipeline."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Compose"]


@dataclass(frozen=True, init=False)
class Compose:
    """The steps of a spec in order, for ``Loader(transform=Compose([...]))`` as ``T.Compose`` is used.

    The steps are stallfree transforms, nested ``Compose`` objects, or torchvision transforms (translated by
    :func:`stallfree.transforms.translation.translator.to_steps`); the Loader flattens them.
    """

    transforms: tuple[Any, ...]

    def __init__(self, transforms: Sequence[Any]):
        if isinstance(transforms, (str, bytes)) or not isinstance(transforms, Sequence):
            raise TypeError(f"Compose takes a list of transforms, got {type(transforms).__name__}: "
                            f"Compose([{transforms!r}])")
        object.__setattr__(self, "transforms", tuple(transforms))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.transforms)

    def __len__(self) -> int:
        return len(self.transforms)
