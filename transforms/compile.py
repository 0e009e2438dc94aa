"""Compile a transform spec into DALI operators plus the host-side drawing of their per-sample parameters.

    host (per batch)                          DALI graph (per batch, on the CPU or the GPU)
    ----------------                          ---------------------------------------------
    sizes from headers ──► draw() per step    encoded bytes ─► decode (only the crop window, if the
    (seed, epoch, sample)  ──► params ──────►                   first step is RandomResizedCrop)
                                              ─► step 1 ─► step 2 ─► ... ─► output (dtype, layout)

Fusions keep the graph shorter than a hand-written DALI pipeline: a ``RandomResizedCrop`` first step becomes a
region-of-interest decode plus a resize; a trailing ``[RandomHorizontalFlip,] Normalize`` and the output cast and
transpose become one ``crop_mirror_normalize``; and where a ``RandomResizedCrop`` or ``Resize`` comes just before
them and the output is float32 RGB, the resampler writes that output itself (``_fuses_resize``): on the CPU, and on
the GPU as a ``numba.cuda`` kernel with the CPU's pixels (``transforms/kernels/resample_cuda.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from stallfree.transforms.ops.flip import RandomHorizontalFlip
from stallfree.transforms.ops.normalize import Normalize
from stallfree.transforms.ops.resize import RandomResizedCrop, Resize
from stallfree.transforms.random import SampleRandom
from stallfree.transforms.spec import GraphState, Size, Transform

__all__ = ["DTYPES", "LAYOUTS", "CompiledTransforms"]

DTYPES = ("float32", "float16", "bfloat16", "uint8")
LAYOUTS = ("NCHW", "NHWC", "channels_last")
Dtype = Literal["float32", "float16", "bfloat16", "uint8"]
Layout = Literal["NCHW", "NHWC", "channels_last"]


class _Reads(Mapping[str, Any]):
    """Parameter input nodes by name (graph inputs are ``"{i}.{name}"``), recording in ``read`` the ones looked up.

    ``prefix`` selects one step's inputs, under the names its ``params`` declares; all views share one ``read``.
    """

    def __init__(self, nodes: Mapping[str, Any], prefix: str = "", read: set[str] | None = None):
        self._nodes, self._prefix = nodes, prefix
        self.read: set[str] = set() if read is None else read

    def step(self, i: int) -> _Reads:
        return _Reads(self._nodes, f"{i}.", self.read)

    def __getitem__(self, name: str) -> Any:
        node = self._nodes[self._prefix + name]
        self.read.add(self._prefix + name)
        return node

    def __iter__(self) -> Iterator[str]:
        n = len(self._prefix)
        return (name[n:] for name in self._nodes if name.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class CompiledTransforms:
    """A checked spec: the parameter inputs the graph needs, how to draw them, and how to build the graph.

    Args:
        steps: the transforms, in order.
        dtype: output element type. ``bfloat16`` leaves DALI as float32 and is cast by the hand-off to torch.
        layout: ``NCHW``; ``NHWC``; or ``channels_last`` (NCHW shape in NHWC memory, as torch names it).
        channels: 3 (RGB) or 1 (luma, as ``Grayscale(num_output_channels=1)``); a ``Grayscale(1)`` step sets it to 1.

    Raises:
        TypeError: a step that is not a :class:`Transform`.
        stallfree.transforms.KernelError: a kernel step that Numba cannot compile (named, with Numba's reason).
        ValueError: an unknown dtype or layout, ``uint8`` output after ``Normalize``, or a spec whose output size
            differs between samples (batches need one size: end with a crop or a fixed-size ``Resize``).
    """

    def __init__(
        self, steps: Sequence[Transform], *, dtype: Dtype = "float32", layout: Layout = "NCHW", channels: int = 3
    ):
        from stallfree.transforms.ops.grayscale import Grayscale

        steps = list(steps)
        for i, step in enumerate(steps):
            if not isinstance(step, Transform):
                raise TypeError(
                    f"transform[{i}] is {step!r}, not a stallfree transform; use the classes in stallfree.transforms "
                    "(torchvision transform objects cannot run inside the DALI graph)"
                )
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels!r}")
        if channels == 1 and not any(isinstance(s, Grayscale) for s in steps):
            steps.insert(1 if steps and isinstance(steps[0], RandomResizedCrop) else 0, Grayscale(1))
        if dtype == "uint8" and any(isinstance(s, Normalize) for s in steps):
            raise ValueError("dtype='uint8' cannot follow Normalize (its output is float); drop one of them")
        state = GraphState("cpu")
        for step in steps:
            step.prepare(state)
            if isinstance(step, Normalize):
                state = GraphState("cpu", "float32")
        # A step that changes nothing (p=0, ColorJitter() with every factor disabled, as torchvision allows) is left
        # out of the graph: it draws nothing and feeds nothing, so no parameter input goes unread.
        self.steps = [step for step in steps if not step.is_identity()]
        steps = self.steps
        self.dtype: Dtype = dtype
        self.layout: Layout = layout
        # The graph keeps 3 equal channels after a Grayscale (so every step sees RGB); the output keeps one.
        self.channels = 1 if any(isinstance(s, Grayscale) and s.num_output_channels == 1 for s in steps) else 3
        self.conditionals = any(step.conditionals for step in steps)
        self.param_inputs: dict[str, type] = {
            f"{i}.{name}": kind for i, step in enumerate(steps) for name, kind in step.params.items()
        }

    @functools.cached_property
    def output_size(self) -> Size:
        """The fixed (height, width) every sample has after the steps.

        Raises:
            ValueError: the steps do not end at a fixed size (checked when an image Loader is built: a token
                source takes no transforms at all).
        """
        size: Size | None = None
        for step in self.steps:
            size = step.size_after(size)
        if size is None:
            raise ValueError(
                "the transforms must give every sample the same size so that they batch; end with CenterCrop(...) "
                f"or RandomResizedCrop(...) or Resize((h, w)); got {self.steps!r}"
            )
        return size

    @property
    def roi_decode(self) -> bool:
        """Whether the first step's window is decoded directly (region-of-interest decoding)."""
        return bool(self.steps) and isinstance(self.steps[0], RandomResizedCrop)

    def draw(self, randoms: Sequence[SampleRandom], sizes: Sequence[Size]) -> dict[str, list[np.ndarray]]:
        """Per-sample parameters of a batch, keyed by graph input name, from each sample's stream and size."""
        batch: dict[str, list[np.ndarray]] = {name: [] for name in self.param_inputs}
        for rng, size in zip(randoms, sizes, strict=True):
            for i, step in enumerate(self.steps):
                params, size = step.draw(rng, size)
                for name, value in params.items():
                    batch[f"{i}.{name}"].append(np.asarray(value, self.param_inputs[f"{i}.{name}"]))
        return batch

    def build(
        self,
        source: Any,
        params: Mapping[str, Any],
        *,
        device: Literal["cpu", "gpu"],
        encoded: bool,
        adjust_orientation: bool = False,
    ) -> Any:
        """The graph from ``source`` (encoded bytes if ``encoded``, else HWC uint8 pixels) to the output batch.

        ``adjust_orientation`` is DALI's decoder argument of that name (its default is ``True``): turn each image
        by its EXIF orientation. Off, the decoders give the stored pixels, as PIL's ``Image.open`` does.
        """
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        inputs = _Reads(params)
        state = GraphState(device)
        steps = list(enumerate(self.steps))
        image = source
        if encoded:
            decoder_device = "mixed" if device == "gpu" else "cpu"
            if self.roi_decode:
                window = inputs["0.window"]
                image = fn.decoders.image_slice(
                    source,
                    window[0:2],
                    window[2:4],
                    axis_names="HW",
                    normalized_anchor=False,
                    normalized_shape=False,
                    output_type=types.RGB,
                    adjust_orientation=adjust_orientation,
                    device=decoder_device,
                )
            else:
                image = fn.decoders.image(
                    source, output_type=types.RGB, adjust_orientation=adjust_orientation, device=decoder_device
                )
        elif device == "gpu":
            image = image.gpu()

        # A trailing [flip,] Normalize folds into the output operator, as does a trailing flip.
        tail_normalize: Normalize | None = None
        if steps and isinstance(steps[-1][1], Normalize):
            tail_normalize = steps[-1][1]
            steps.pop()
        mirror: Any = None
        if steps and isinstance(steps[-1][1], RandomHorizontalFlip):
            i, _ = steps.pop()
            mirror = inputs[f"{i}.flip"]
        window_decoded = encoded and self.roi_decode
        last = steps.pop() if self._fuses_resize(steps) else None
        for i, step in steps:
            if i == 0 and window_decoded and isinstance(step, RandomResizedCrop):
                image, state = step.build_decoded_window(image, inputs.step(0), state)
            else:
                image, state = step.build(image, inputs.step(i), state)
        if last is not None:
            out = self._resize_normalize(image, last, inputs, window_decoded, tail_normalize, mirror, device)
        else:
            out = self._output(image, state, tail_normalize, 0 if mirror is None else mirror)
        self._check_read(inputs.read)
        return out

    def _fuses_resize(self, steps: list[tuple[int, Transform]]) -> bool:
        """Whether the last of ``steps`` is a uint8 resize that can write the float32 output itself.

        Then the resampler (``transforms/kernels/resample_node.py``) writes the normalized, mirrored float32 output in
        its layout, and the ``crop_mirror_normalize`` that would copy the uint8 batch once more is left out. On the GPU
        this is what puts PIL's filters, and so the CPU graph's pixels, where ``fn.resize`` was.
        """
        if self.dtype != "float32" or self.channels != 3 or not steps:
            return False
        index, last = steps[-1]
        if not isinstance(last, (RandomResizedCrop, Resize)) or last.interpolation == "nearest":
            return False  # nearest is a gather, not the resampler
        # The resampler takes uint8 only: no Normalize (a float image) before the resize.
        return not any(isinstance(step, Normalize) for _, step in steps[:-1])

    def _resize_normalize(
        self,
        image: Any,
        step: tuple[int, Transform],
        inputs: _Reads,
        window_decoded: bool,
        normalize: Normalize | None,
        mirror: Any,
        device: Literal["cpu", "gpu"],
    ) -> Any:
        from stallfree.transforms.kernels.filters import FILTERS
        from stallfree.transforms.kernels.resample_node import resize_normalize_node

        i, resize = step
        assert isinstance(resize, (RandomResizedCrop, Resize))
        params = inputs.step(i)
        # A first RandomResizedCrop's window was decoded already; a later one crops the pixels it gets.
        windowed = isinstance(resize, RandomResizedCrop) and not (i == 0 and window_decoded)
        window = params["window"] if windowed else None
        uint8 = GraphState("cpu")
        mean, std = normalize.scaled(uint8) if normalize is not None else ([0.0] * 3, [255.0] * 3)
        return resize_normalize_node(
            image,
            params["size"],
            mean=mean,
            std=std,
            chw=self.layout == "NCHW",
            antialias=resize.antialias,
            window=window,
            mirror=mirror,
            kind=FILTERS[resize.interpolation],
            device=device,
        )

    def _check_read(self, read: set[str]) -> None:
        """Refuse a step whose ``build`` left a declared input unread: DALI drops it, and feeding it would fail."""
        unread = [name for name in self.param_inputs if name not in read]
        if unread:
            index, _ = unread[0].split(".", 1)
            names = [name.split(".", 1)[1] for name in unread if name.startswith(f"{index}.")]
            raise TypeError(
                f"{self.steps[int(index)]!r} declares the per-sample inputs {names} in params "
                "but its build() does not read them; build must read every input it declares, and a step that "
                "leaves the image as it is should return True from is_identity()"
            )

    def _output(self, image: Any, state: GraphState, normalize: Normalize | None, mirror: Any) -> Any:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types

        if normalize is not None:
            mean, std = normalize.scaled(state)
        elif state.dtype == "uint8" and self.dtype != "uint8":
            mean, std = [0.0] * 3, [255.0] * 3  # float output without Normalize is scaled to [0, 1], as ToTensor
        else:
            mean, std = [0.0] * 3, [1.0] * 3
        out_type = {"uint8": types.UINT8, "float16": types.FLOAT16}.get(self.dtype, types.FLOAT)
        out = fn.crop_mirror_normalize(
            image,
            mean=mean,
            std=std,
            mirror=mirror,
            dtype=out_type,
            output_layout="CHW" if self.layout == "NCHW" else "HWC",
            device=state.device,
        )
        if self.channels == 1:
            out = out[0:1, :, :] if self.layout == "NCHW" else out[:, :, 0:1]
        return out
