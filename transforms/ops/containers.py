"""``RandomApply``, ``RandomChoice``, ``RandomOrder``: steps chosen per sample (the SimCLR recipe's containers).

The choice is drawn on the host like every other parameter, from the sample's keyed stream, as torchvision draws
it: ``RandomApply`` applies its steps where a uniform ``u`` has ``u <= p`` (torchvision skips them where
``p < torch.rand(1)``), and ``RandomChoice`` picks step ``k`` with probability ``p[k]`` (uniform by default). In the
graph the choice is a per-sample input that selects a branch with DALI's conditional execution::

    apply = (choice input == 1)             if apply:  image = step_1(... step_0(image))
                                            else:      image = image

so the samples that skip a step skip its work too: DALI splits the batch by the predicate, runs each branch on
its part and merges the parts back in order (the pipeline is then defined with ``enable_conditionals=True``).
``RandomOrder`` draws a permutation (uniform, as torchvision's shuffle) and applies, at each position, the step the
permutation puts there: n positions of n branches, each sample running each step once.

Every sample still draws the parameters of every inner step, applied or not (they are inputs of the graph, one per
sample), so a step's draws never depend on whether the one before it was applied. An inner step may change the
size (``RandomApply([CenterCrop(...)])``); then the samples of a batch differ in size until a later step fixes it.
An inner step may not change the element type (``Normalize``): both branches must give the same type.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stallfree.transforms.ops.normalize import Normalize
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["RandomApply", "RandomChoice", "RandomOrder"]


class _Inner(Mapping[str, Any]):
    """Inner step ``k``'s parameter inputs, stored under ``"{k}.{name}"`` in its container's."""

    def __init__(self, params: Mapping[str, Any], k: int):
        self._params, self._prefix = params, f"{k}."

    def __getitem__(self, name: str) -> Any:
        return self._params[self._prefix + name]

    def __iter__(self) -> Iterator[str]:
        n = len(self._prefix)
        return (name[n:] for name in self._params if name.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _steps(name: str, transforms: Sequence[Transform]) -> tuple[Transform, ...]:
    if isinstance(transforms, Transform) or not isinstance(transforms, Sequence) or not transforms:
        raise TypeError(f"{name} takes a non-empty list of stallfree transforms, got {transforms!r}")
    for i, step in enumerate(transforms):
        if not isinstance(step, Transform):
            raise TypeError(f"{name}: transforms[{i}] is {step!r}, not a stallfree transform")
        if isinstance(step, Normalize):
            raise ValueError(f"{name}: transforms[{i}] is Normalize, which changes the element type in one branch "
                             "only; put Normalize after it")
    return tuple(transforms)


def _live(transforms: Sequence[Transform]) -> list[Transform]:
    # Steps that change nothing are left out, as the compiler leaves them out of the spec.
    return [step for step in transforms if not step.is_identity()]


def _inner_params(transforms: Sequence[Transform]) -> dict[str, type]:
    return {f"{k}.{name}": kind for k, step in enumerate(_live(transforms)) for name, kind in step.params.items()}


def _draw_all(transforms: Sequence[Transform], rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
    params: dict[str, Any] = {}
    for k, step in enumerate(_live(transforms)):
        drawn, size = step.draw(rng, size)
        params.update({f"{k}.{name}": value for name, value in drawn.items()})
    return params, size


def _build_all(
    transforms: Sequence[Transform], image: Any, params: Mapping[str, Any], state: GraphState
) -> tuple[Any, GraphState]:
    for k, step in enumerate(_live(transforms)):
        image, state = step.build(image, _Inner(params, k), state)
    return image, state


def _size_after(transforms: Sequence[Transform], size: Size | None) -> Size | None:
    for step in _live(transforms):
        size = step.size_after(size)
    return size


@dataclass(frozen=True)
class RandomApply(Transform):
    """Apply ``transforms`` in order with probability ``p``, else none of them (torchvision's ``RandomApply``)."""

    transforms: Sequence[Transform]
    p: float = 0.5
    conditionals = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _steps("RandomApply", self.transforms))
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomApply: p must be in [0, 1], got {self.p}")

    @property
    def params(self) -> Mapping[str, type]:  # type: ignore[override]
        return {"apply": np.int32, **_inner_params(self.transforms)}

    @property
    def changes_size(self) -> bool:  # type: ignore[override]
        return any(step.changes_size for step in _live(self.transforms))

    def size_after(self, size: Size | None) -> Size | None:
        applied = _size_after(self.transforms, size)
        return size if applied == size else None

    def is_identity(self) -> bool:
        return self.p == 0 or not _live(self.transforms)

    def prepare(self, state: GraphState) -> None:
        for step in self.transforms:
            step.prepare(state)

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        apply = not self.p < rng.random()
        params, applied_size = _draw_all(self.transforms, rng, size)
        params["apply"] = np.array(apply, np.int32)
        return params, applied_size if apply else size

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        apply = fn.cast(params["apply"], dtype=types.BOOL)
        out = image
        if apply:
            out, _ = _build_all(self.transforms, image, params, state)
        return out, state


@dataclass(frozen=True)
class RandomChoice(Transform):
    """Apply one of ``transforms``, step ``k`` with probability ``p[k]`` (uniform if ``None``), as torchvision's."""

    transforms: Sequence[Transform]
    p: Sequence[float] | None = None
    conditionals = True

    def __post_init__(self) -> None:
        steps = _steps("RandomChoice", self.transforms)
        object.__setattr__(self, "transforms", steps)
        if self.p is not None:
            if len(self.p) != len(steps):
                raise ValueError(f"RandomChoice: p needs one weight per transform (transforms: {len(steps)}, "
                                 f"p: {len(self.p)})")
            if any(not math.isfinite(w) or w < 0 for w in self.p) or sum(self.p) <= 0:
                raise ValueError(f"RandomChoice: p must be non-negative weights with a positive sum, got {self.p!r}")
            object.__setattr__(self, "p", tuple(float(w) for w in self.p))

    @property
    def params(self) -> Mapping[str, type]:  # type: ignore[override]
        params: dict[str, type] = {"choice": np.int32}
        for k, step in enumerate(self.transforms):
            if not step.is_identity():  # a branch that changes nothing draws and builds nothing
                params.update({f"{k}.{name}": kind for name, kind in step.params.items()})
        return params

    @property
    def changes_size(self) -> bool:  # type: ignore[override]
        return any(step.changes_size for step in _live(self.transforms))

    def fixed_size(self) -> Size | None:
        sizes = {None if step.is_identity() else step.fixed_size() for step in self.transforms}
        return sizes.pop() if len(sizes) == 1 else None

    def size_after(self, size: Size | None) -> Size | None:
        sizes = {size if step.is_identity() else step.size_after(size) for step in self.transforms}
        return sizes.pop() if len(sizes) == 1 else None

    def weights(self) -> list[float]:
        """The probability of each step."""
        n = len(self.transforms)
        weights = [1.0] * n if self.p is None else list(self.p)
        total = sum(weights)
        return [w / total for w in weights]

    def prepare(self, state: GraphState) -> None:
        for step in self.transforms:
            step.prepare(state)

    def choose(self, rng: SampleRandom) -> int:
        """The index of the step this sample gets: where a uniform falls among the cumulative weights."""
        u, total = rng.random(), 0.0
        weights = self.weights()
        for k, w in enumerate(weights):
            total += w
            if u < total:
                return k
        return max(k for k, w in enumerate(weights) if w > 0)  # u within rounding of 1

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        choice = self.choose(rng)
        params: dict[str, Any] = {"choice": np.array(choice, np.int32)}
        chosen_size = size
        for k, step in enumerate(self.transforms):
            if step.is_identity():
                continue
            drawn, after = step.draw(rng, size)
            params.update({f"{k}.{name}": value for name, value in drawn.items()})
            if k == choice:
                chosen_size = after
        return params, chosen_size

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        choice = params["choice"]
        out = image
        for k, step in enumerate(self.transforms):
            if step.is_identity():
                continue  # its samples keep the image
            if choice == k:
                out, _ = step.build(image, _Inner(params, k), state)
        return out, state

    def is_identity(self) -> bool:
        return all(step.is_identity() for step in self.transforms)


@dataclass(frozen=True)
class RandomOrder(Transform):
    """Apply all of ``transforms``, in an order drawn per sample uniformly among all orders (torchvision's)."""

    transforms: Sequence[Transform]
    conditionals = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "transforms", _steps("RandomOrder", self.transforms))

    @property
    def params(self) -> Mapping[str, type]:  # type: ignore[override]
        return {"order": np.int32, **_inner_params(self.transforms)}

    @property
    def changes_size(self) -> bool:  # type: ignore[override]
        return any(step.changes_size for step in _live(self.transforms))

    def size_after(self, size: Size | None) -> Size | None:
        return size if not self.changes_size else None  # the order decides the size when a step changes it

    def is_identity(self) -> bool:
        return not _live(self.transforms)

    def prepare(self, state: GraphState) -> None:
        for step in self.transforms:
            step.prepare(state)

    def draw(self, rng: SampleRandom, size: Size) -> tuple[dict[str, Any], Size]:
        live = _live(self.transforms)
        order = rng.permutation(len(live))
        params: dict[str, Any] = {"order": np.array(order, np.int32)}
        for k in order:  # each step sees the size the steps before it in this order leave
            drawn, size = live[k].draw(rng, size)
            params.update({f"{k}.{name}": value for name, value in drawn.items()})
        return params, size

    def build(self, image: Any, params: Mapping[str, Any], state: GraphState) -> tuple[Any, GraphState]:
        live = _live(self.transforms)
        order = params["order"]
        out = image
        for position in range(len(live)):
            current = out
            for k, step in enumerate(live):
                if order[position] == k:
                    out, _ = step.build(current, _Inner(params, k), state)
        return out, state
