"""Translate what a user passes as ``transform=`` into the spec: torchvision pipelines included.

``Loader(transform=...)`` takes a stallfree step, a :class:`~stallfree.transforms.Compose`, a list, or
torchvision's own objects (``T.Compose``, ``v2.Compose``, a single transform, a list of them, mixed with stallfree
steps). torchvision's classes are recognised by the module their type comes from, so nothing here imports
torchvision: a user without it never loads it, and a user with it gets the objects they built translated with
their parameters: the type conversions, resizes, flips, containers and policies here, the geometric steps through
:data:`.geometry.TRANSLATORS` and the photometric ones through :data:`.photometric.TRANSLATORS`. Anything else (a
lambda, a custom class, a torchvision class with no counterpart) is refused with a ``TypeError`` that names it and
says what to do instead: a per-pixel ``@kernel`` where one can do it, the output batch where it moves pixels.

torchvision converts types along a pipeline (PIL image, uint8 tensor, float tensor), and stallfree's graph has
the same three states: uint8 until ``Normalize``, float after. The translation follows them::

    torchvision                                     stallfree
    ToTensor() / ToImage()+ToDtype(float, scale)    float on [0, 1]: folded into the next Normalize, or the
                                                    output's own scaling when nothing follows
    Normalize(mean, std) after it                   Normalize(mean, std)
    PILToTensor() / ToImage() last                  dtype uint8 (the Loader's default dtype becomes uint8)
    ToDtype(float, scale=False)                     float on 0-255: Normalize(mean/255, std/255)
    any other step after a float conversion         a conversion step first (Normalize((0,), (1,)) for [0, 1]),
                                                    so that the step sees the floats torchvision's would
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from stallfree.transforms import spec
from stallfree.transforms.compile import Dtype
from stallfree.transforms.ops.bundled import RandomErasing, RandomGrayscale
from stallfree.transforms.ops.color import ColorJitter
from stallfree.transforms.ops.compose import Compose
from stallfree.transforms.ops.containers import RandomApply, RandomChoice, RandomOrder
from stallfree.transforms.ops.flip import RandomHorizontalFlip, RandomVerticalFlip
from stallfree.transforms.ops.geometry import CenterCrop
from stallfree.transforms.ops.grayscale import Grayscale
from stallfree.transforms.ops.normalize import Normalize
from stallfree.transforms.ops.policies import AutoAugment, RandAugment, TrivialAugmentWide
from stallfree.transforms.ops.resize import RandomResizedCrop, Resize
from stallfree.transforms.translation.geometry import TRANSLATORS as _GEOMETRIC
from stallfree.transforms.translation.geometry import enum_value as _enum
from stallfree.transforms.translation.geometry import interpolation as _interpolation
from stallfree.transforms.translation.photometric import TRANSLATORS as _PHOTOMETRIC

__all__ = ["Spec", "is_torchvision", "to_steps"]

Pixels = Literal["uint8", "float01", "float255", "float"]  # what torchvision's pipeline holds at a point

_KERNEL_HINT = (
    "if it changes each pixel where it stands, write it as a per-pixel @kernel (stallfree.transforms.kernel plus a "
    "KernelTransform subclass whose sample() draws its random parameters; see docs/kernels.md); if it moves pixels "
    "or changes the size, which a kernel cannot, apply it to the output batch yourself"
)
_BATCH = "apply it to the Loader's output batch yourself (a torch tensor, on the training device)"
#: What to do instead, for torchvision's classes that stallfree does not translate and a @kernel cannot replace.
_INSTEAD: dict[str, str] = {
    "ElasticTransform": "its displacement field moves pixels, which a per-pixel @kernel cannot do; " + _BATCH,
    "FiveCrop": "it makes five images of each sample, and a batch holds one image a sample; " + _BATCH
                + " (torchvision.transforms.v2.functional.five_crop takes batches)",
    "TenCrop": "it makes ten images of each sample, and a batch holds one image a sample; " + _BATCH
               + " (torchvision.transforms.v2.functional.ten_crop takes batches)",
    "RandomIoUCrop": "it crops around the sample's bounding boxes, which the Loader does not carry; " + _BATCH,
    "LinearTransformation": "it mixes every pixel of the flattened image (a whitening matrix), which a per-pixel "
                            "@kernel cannot do; " + _BATCH,
    "MixUp": "it mixes the samples of a batch: mix the output batch with stallfree.transforms.MixUp "
             "(mix = MixUp(alpha, num_classes); images, targets = mix(images, labels))",
    "CutMix": "it mixes the samples of a batch: mix the output batch with stallfree.transforms.CutMix "
              "(mix = CutMix(alpha, num_classes); images, targets = mix(images, labels))",
}
_FLOAT_DTYPES: dict[str, Dtype] = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


@dataclass(frozen=True)
class Spec:
    """A translated ``transform=``: the stallfree steps, and the output dtype the pipeline implies (or ``None``).

    ``dtype`` is ``"uint8"`` for a torchvision pipeline that ends as a uint8 tensor (``PILToTensor``, ``ToImage``)
    and the float type of a ``ToDtype``/``ConvertImageDtype``; the Loader uses it when ``dtype`` is not given.
    """

    steps: tuple[spec.Transform, ...]
    dtype: Dtype | None = None


def is_torchvision(obj: Any) -> bool:
    """Whether ``obj`` is an instance of one of torchvision's transform classes (by its type's module)."""
    return type(obj).__module__.startswith("torchvision.transforms")


def _name(obj: Any) -> str:
    if getattr(obj, "__name__", None) == "<lambda>":
        code = getattr(obj, "__code__", None)
        where = f" defined at {code.co_filename}:{code.co_firstlineno}" if code is not None else ""
        return f"a lambda{where}"
    kind = obj if callable(obj) and hasattr(obj, "__qualname__") else type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def _refuse(where: str, obj: Any, why: str = "") -> TypeError:
    instead = _INSTEAD.get(type(obj).__name__) if is_torchvision(obj) else None
    if instead:
        return TypeError(f"{where} is {_name(obj)}: stallfree does not reproduce it: {instead}")
    reason = why or "it is not a stallfree transform, and Python code cannot run inside the DALI graph"
    return TypeError(f"{where} is {_name(obj)}: {reason}; {_KERNEL_HINT}")


def to_steps(transform: Any) -> Spec:
    """The spec for ``transform=``: a step, a Compose (stallfree's or torchvision's), a list, or ``None``.

    Raises:
        TypeError: a step that is neither a stallfree transform nor a torchvision transform stallfree has (named,
            with how to write it as a kernel).
        ValueError: a torchvision transform with a parameter stallfree does not reproduce (say which and why).
    """
    if transform is None:
        return Spec(())
    flat: list[tuple[str, Any]] = []
    _flatten("transform", transform, flat)
    if not any(is_torchvision(obj) for _, obj in flat):
        return Spec(tuple(obj for _, obj in flat))
    return _Translation().run(flat)


def _flatten(where: str, obj: Any, out: list[tuple[str, Any]]) -> None:
    if isinstance(obj, spec.Transform):
        out.append((where, obj))
    elif isinstance(obj, Compose) or (is_torchvision(obj) and type(obj).__name__ == "Compose"):
        for i, step in enumerate(obj.transforms):
            _flatten(f"{where}[{i}]", step, out)
    elif isinstance(obj, (list, tuple)):
        for i, step in enumerate(obj):
            _flatten(f"{where}[{i}]", step, out)
    elif is_torchvision(obj):
        out.append((where, obj))
    else:
        raise _refuse(where, obj)


def _fill(where: str, t: Any) -> int | tuple[int, ...] | None:
    """A policy's fill: one value, one per channel (the policy checks their count and range), or ``None``."""
    fill = getattr(t, "fill", None)
    if isinstance(fill, dict):  # v2 keeps the fill per input type
        values = {str(v) for v in fill.values()}
        if len(values) != 1:
            raise ValueError(f"{where}: {type(t).__name__}(fill={fill!r}) gives each input type its own fill; "
                             "give one fill (a value or one per channel) for images")
        fill = next(iter(fill.values()))
    if isinstance(fill, (list, tuple)) and len(set(fill)) == 1:
        fill = fill[0]
    if isinstance(fill, (list, tuple)):
        return tuple(int(v) for v in fill)
    if fill is not None and not isinstance(fill, (int, float)):
        raise ValueError(f"{where}: {type(t).__name__}(fill={fill!r}) is not reproduced; give a number or one per "
                         "channel")
    return None if fill is None else int(fill)


def _resize_size(size: Any) -> Any:
    # torchvision reads a one-element sequence as the shorter side, like an int (v2 stores Resize(256) as [256]).
    if isinstance(size, (list, tuple)) and len(size) == 1:
        return int(size[0])
    return tuple(size) if isinstance(size, (list, tuple)) else size


class _Translation:
    """One pass over a flattened pipeline, following torchvision's pixel type from step to step."""

    def __init__(self) -> None:
        self.steps: list[spec.Transform] = []
        self.pixels: Pixels = "uint8"  # a PIL image or a uint8 tensor: the graph's uint8
        self.tensor = False  # whether the pipeline holds a tensor (for the dtype it ends with)
        self.dtype: Dtype | None = None

    def run(self, flat: list[tuple[str, Any]]) -> Spec:
        for where, obj in flat:
            self._step(where, obj)
        if self.pixels == "float255":
            self.steps.append(Normalize((0.0,), (1 / 255,)))  # x / 255 / (1 / 255): the 0-255 floats themselves
        elif self.pixels == "uint8" and self.tensor:
            self.dtype = "uint8"
        return Spec(tuple(self.steps), self.dtype)

    def _step(self, where: str, obj: Any) -> None:
        if isinstance(obj, spec.Transform):
            self._emit(obj, where)
            return
        name = type(obj).__name__
        handler = _HANDLERS.get(name)
        if handler is not None:
            handler(self, where, obj)
        elif name in _GEOMETRIC:
            self._emit(_GEOMETRIC[name](where, obj), where)
        elif name in _PHOTOMETRIC:
            self._emit(_PHOTOMETRIC[name](where, obj), where)
        else:
            raise _refuse(where, obj, f"torchvision's {name} has no stallfree counterpart yet")

    def _inner(self, where: str, t: Any) -> list[tuple[spec.Transform, ...]]:
        """The steps of each branch of a container (``RandomApply``, ``RandomChoice``), on the pixels held here.

        Each of ``t.transforms`` is one branch (a ``Compose`` among them, several steps). A pending float conversion
        is made before the container (every branch sees the same floats); a type conversion inside one is refused,
        since the branches would give different types.
        """
        if self.pixels in ("float01", "float255"):
            scale = 1.0 if self.pixels == "float01" else 1 / 255
            self.steps.append(Normalize((0.0,), (scale,)))
            self.pixels = "float"
        branches = []
        for i, step in enumerate(t.transforms):
            inner = _Translation()
            inner.pixels, inner.tensor = self.pixels, self.tensor
            flat: list[tuple[str, Any]] = []
            _flatten(f"{where}.transforms[{i}]", step, flat)
            for inner_where, obj in flat:
                inner._step(inner_where, obj)
            if inner.pixels != self.pixels or inner.dtype is not None:
                raise ValueError(f"{where}: {type(t).__name__} with a type conversion (ToTensor, ToDtype, Normalize) "
                                 "inside is not reproduced; put the conversion before or after it")
            branches.append(tuple(inner.steps))
        return branches

    def _emit(self, step: spec.Transform, where: str) -> None:
        if isinstance(step, Normalize):
            self.pixels = "float"
        elif self.pixels in ("float01", "float255"):
            # A step after ToTensor works on floats in torchvision, so the graph converts here too.
            scale = 1.0 if self.pixels == "float01" else 1 / 255
            self.steps.append(Normalize((0.0,), (scale,)))
            self.pixels = "float"
        self.steps.append(step)

    # --- type conversions -----------------------------------------------------------------------------------------

    def to_tensor(self, where: str, t: Any) -> None:
        self.pixels, self.tensor = "float01", True

    def to_image(self, where: str, t: Any) -> None:
        self.tensor = True

    def to_dtype(self, where: str, t: Any) -> None:
        dtype = getattr(t, "dtype", None)
        if isinstance(dtype, dict):
            raise ValueError(f"{where}: ToDtype with a per-type dict is not reproduced; pass one dtype")
        name = str(dtype).removeprefix("torch.")
        scale = bool(getattr(t, "scale", type(t).__name__ == "ConvertImageDtype"))
        if name == "uint8":
            if self.pixels != "uint8":
                raise ValueError(f"{where}: {type(t).__name__}(torch.uint8) after a float conversion is not reproduced")
            return
        if name not in _FLOAT_DTYPES:
            raise ValueError(f"{where}: {type(t).__name__}({dtype}) is not reproduced; stallfree outputs uint8, "
                             "float32, float16 or bfloat16")
        self.dtype, self.tensor = _FLOAT_DTYPES[name], True
        if self.pixels == "uint8":
            self.pixels = "float01" if scale else "float255"

    def normalize(self, where: str, t: Any) -> None:
        if self.pixels == "uint8":
            raise ValueError(f"{where}: Normalize before ToTensor: torchvision needs a float tensor here too; put "
                             "T.ToTensor() (or v2.ToImage(), v2.ToDtype(torch.float32, scale=True)) before it")
        mean, std = [float(m) for m in t.mean], [float(s) for s in t.std]
        if self.pixels == "float255":  # folded with the pending conversion: (x - m) / s on 0-255 values
            mean, std = [m / 255 for m in mean], [s / 255 for s in std]
        # After a float step the graph holds floats on torchvision's scale, and Normalize applies as it stands.
        self.steps.append(Normalize(tuple(mean), tuple(std)))
        self.pixels = "float"

    # --- geometry and colour --------------------------------------------------------------------------------------

    def random_resized_crop(self, where: str, t: Any) -> None:
        interpolation, antialias = _interpolation(where, t)
        step = RandomResizedCrop(tuple(t.size), tuple(t.scale), tuple(t.ratio), antialias=antialias,
                                 interpolation=interpolation)
        self._emit(step, where)

    def resize(self, where: str, t: Any) -> None:
        interpolation, antialias = _interpolation(where, t)
        if t.size is None:
            raise ValueError(f"{where}: Resize(size=None, max_size=...) is not reproduced; give the shorter side")
        self._emit(Resize(_resize_size(t.size), antialias=antialias, max_size=t.max_size,
                          interpolation=interpolation), where)

    def center_crop(self, where: str, t: Any) -> None:
        self._emit(CenterCrop(tuple(t.size)), where)

    def hflip(self, where: str, t: Any) -> None:
        self._emit(RandomHorizontalFlip(float(t.p)), where)

    def vflip(self, where: str, t: Any) -> None:
        self._emit(RandomVerticalFlip(float(t.p)), where)

    def color_jitter(self, where: str, t: Any) -> None:
        # torchvision keeps each factor as a checked (min, max) or None (disabled).
        def pair(value: Any) -> Any:
            return 0 if value is None else (float(value[0]), float(value[1]))

        hue = t.hue
        self._emit(ColorJitter(pair(t.brightness), pair(t.contrast), pair(t.saturation),
                               0 if hue is None else (float(hue[0]), float(hue[1]))), where)

    def random_grayscale(self, where: str, t: Any) -> None:
        self._emit(RandomGrayscale(float(t.p)), where)

    def grayscale(self, where: str, t: Any) -> None:
        self._emit(Grayscale(int(t.num_output_channels)), where)

    def random_erasing(self, where: str, t: Any) -> None:
        value = "random" if t.value is None else t.value  # v2 keeps value="random" as None
        if isinstance(value, (list, tuple)):
            value = value[0] if len(value) == 1 else tuple(value)  # v2 keeps value=0 as [0.0]
        self._emit(RandomErasing(float(t.p), tuple(t.scale), tuple(t.ratio), value), where)

    def random_apply(self, where: str, t: Any) -> None:
        steps = tuple(step for branch in self._inner(where, t) for step in branch)  # applied together, in order
        self._emit(RandomApply(steps, float(t.p)), where)

    def random_order(self, where: str, t: Any) -> None:
        branches = [steps[0] if len(steps) == 1 else RandomApply(steps, 1.0) for steps in self._inner(where, t)]
        self._emit(RandomOrder(branches), where)

    def random_choice(self, where: str, t: Any) -> None:
        weights = None if t.p is None else tuple(float(w) for w in t.p)
        # A branch of several steps (a Compose) is a RandomApply that always applies: one branch, in order.
        branches = [steps[0] if len(steps) == 1 else RandomApply(steps, 1.0) for steps in self._inner(where, t)]
        self._emit(RandomChoice(branches, weights), where)

    # --- policies -------------------------------------------------------------------------------------------------

    def auto_augment(self, where: str, t: Any) -> None:
        interpolation: Any = _enum(t.interpolation)
        policy: Any = _enum(t.policy)  # AutoAugment checks it against its policies, naming them
        self._emit(AutoAugment(policy, interpolation, _fill(where, t)), where)

    def rand_augment(self, where: str, t: Any) -> None:
        interpolation: Any = _enum(t.interpolation)
        self._emit(RandAugment(int(t.num_ops), int(t.magnitude), int(t.num_magnitude_bins), interpolation,
                               _fill(where, t)), where)

    def trivial_augment(self, where: str, t: Any) -> None:
        interpolation: Any = _enum(t.interpolation)
        self._emit(TrivialAugmentWide(int(t.num_magnitude_bins), interpolation, _fill(where, t)), where)


_HANDLERS: dict[str, Callable[[_Translation, str, Any], None]] = {
    "ToTensor": _Translation.to_tensor,
    "ToImage": _Translation.to_image,
    "PILToTensor": _Translation.to_image,
    "ToImageTensor": _Translation.to_image,
    "ToPureTensor": lambda self, where, t: None,
    "ToDtype": _Translation.to_dtype,
    "ConvertImageDtype": _Translation.to_dtype,
    "Normalize": _Translation.normalize,
    "RandomResizedCrop": _Translation.random_resized_crop,
    "Resize": _Translation.resize,
    "CenterCrop": _Translation.center_crop,
    "RandomApply": _Translation.random_apply,
    "RandomChoice": _Translation.random_choice,
    "RandomOrder": _Translation.random_order,
    "RandomHorizontalFlip": _Translation.hflip,
    "RandomVerticalFlip": _Translation.vflip,
    "ColorJitter": _Translation.color_jitter,
    "RandomGrayscale": _Translation.random_grayscale,
    "Grayscale": _Translation.grayscale,
    "RandomErasing": _Translation.random_erasing,
    "AutoAugment": _Translation.auto_augment,
    "RandAugment": _Translation.rand_augment,
    "TrivialAugmentWide": _Translation.trivial_augment,
}
