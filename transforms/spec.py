"""The augmentation spec: torchvision's names and semantics, each step able to put itself into a DALI graph.

A step does two things. On the host, :meth:`Transform.draw` turns one sample's random stream and its current
``(height, width)`` into explicit per-sample parameters (a crop window, a flip bit), exactly as torchvision
draws them. In the graph, :meth:`Transform.build` applies those parameters with DALI operators, which receive
them as per-sample inputs. Randomness therefore never lives inside DALI, and a sample's augmentation depends on
``(seed, epoch, sample)`` alone (DESIGN.md, "Augmentation randomness is keyed by sample").

Images flow through the graph as HWC; uint8 until :class:`~stallfree.transforms.ops.normalize.Normalize`, float32
after it. The steps themselves are in :mod:`stallfree.transforms.ops`; this module is what each of them is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stallfree.transforms.random import SampleRandom

__all__ = ["GraphState", "Size", "Transform", "size_input", "size_pair"]

Size = tuple[int, int]  # (height, width), as torchvision orders sizes


def size_pair(name: str, size: int | Sequence[int]) -> Size:
    """``size`` (an int, or one or two ints) as ``(height, width)``; a ``ValueError`` naming step ``name`` if not."""
    # No annotated locals here: DALI's AutoGraph (conditional graphs) cannot rewrite them.
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        height = width = int(size)
    elif isinstance(size, Sequence) and len(size) in (1, 2) and all(isinstance(s, (int, np.integer)) for s in size):
        height, width = int(size[0]), int(size[-1])
    else:
        raise ValueError(f"{name}: size must be an int or a (height, width) pair of ints, got {size!r}")
    if min(height, width) <= 0:
        raise ValueError(f"{name}: size must be positive, got {size!r}")
    return height, width



@dataclass(frozen=True)
class GraphState:
    """What the graph compiler knows about the image between steps."""

    device: Literal["cpu", "gpu"]
    dtype: Literal["uint8", "float32"] = "uint8"


def size_input(size: Size) -> np.ndarray:
    """A step's output ``(height, width)`` as a per-sample graph input: the shape of an empty uint8 array.

    A shape, not values, because DALI sizes a Numba operator's output from its input shapes alone; carried this
    way, one compiled resampler serves every size (``transforms/kernels/resample_node.py``).
    """
    return np.empty((size[0], size[1], 0), np.uint8)



class Transform:
    """One step of the spec. Subclasses are frozen dataclasses that check their arguments in ``__post_init__``."""

    #: Names of the per-sample parameters :meth:`draw` returns and :meth:`build` reads, with their NumPy dtypes.
    params: Mapping[str, type] = {}
    #: Whether the step can change the image size (then :meth:`fixed_size` says whether it fixes it).
    changes_size: bool = False
    #: Whether the step uses DALI's conditional execution (the graph is then defined with enable_conditionals).
    conditionals: bool = False

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        """This sample's parameters, given its current ``(height, width)``, and its ``(height, width)`` after."""
        return {}, size

    def prepare(self, state: GraphState) -> None:
        """Check the step against the image it will get and do costly set-up (kernel compilation) now.

        Called when the spec is checked, before any graph is built, so that a step that cannot run fails at
        ``Loader(...)`` rather than at the first batch.
        """

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        """Apply the step to a DALI node, with ``params`` as DALI nodes of per-sample values."""
        raise NotImplementedError

    def fixed_size(self) -> Size | None:
        """The output ``(height, width)`` if this step makes every sample the same size, else ``None``."""
        return None

    def size_after(self, size: Size | None) -> Size | None:
        """The size every sample has after this step, given the size every sample has before (``None``: it varies)."""
        fixed = self.fixed_size()
        if fixed is not None:
            return fixed
        return None if self.changes_size else size

    def is_identity(self) -> bool:
        """Whether the step leaves every image as it is, whatever it draws (``p=0``, a ``ColorJitter()``).

        The compiler drops such a step, as torchvision never changes the image there: it draws nothing, feeds the
        graph nothing and builds nothing, so the inputs fed always equal the inputs the graph reads.
        """
        return False
