"""The DALI graph's assembly and the hand-off of its output to torch.

External sources feed the images and each per-sample parameter; the compiled transforms make the rest of the
graph; each output batch becomes a torch tensor through DLPack, without a copy. A batch can be fed and scheduled
(:meth:`Graph.submit`) while the one before it still runs, and is collected in order (:meth:`Graph.collect`), so
that DALI's threads do not wait while the next batch is fed (docs/speed.md).

Decoding agrees with PIL's ``Image.open(f).convert("RGB")``, torchvision's ImageFolder decode: the decoders do not
turn images by their EXIF orientation unless ``exif="apply"`` (then as ``ImageOps.exif_transpose`` does). One kind
of file DALI decodes otherwise: more than 8 bits per sample (a 16-bit PNG, TIFF, JPEG 2000 or PNM), whose samples
DALI scales to 8 bits where PIL clips grayscale (``I;16``) to 255 and keeps the high byte of colour; and, under
``exif="ignore"``, a TIFF with an orientation tag, which PIL's TIFF plugin turns on ``Image.open`` while DALI keeps
it as stored. Those few files are decoded by PIL on the host and enter the graph as an 8-bit PNG of PIL's pixels
(already turned under ``exif="apply"``).
"""

from __future__ import annotations

import io
import re
import sys
import threading
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import nvidia.dali  # noqa: F401 - imported first so that its exit hook runs after the Loader's (see epoch.py)
import torch

from stallfree.ingest.images import Exif, read_header
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.dali_types import dali_type

__all__ = ["Graph", "GraphError", "Ticket"]


class GraphError(RuntimeError):
    """The DALI graph failed on a batch; ``bad`` lists the positions in the batch that fail on their own.

    ``reasons`` gives each bad sample's own error (from its run alone), in the order of ``bad``.
    """

    def __init__(self, message: str, bad: list[int], reasons: list[str] | None = None):
        super().__init__(message)
        self.bad = bad
        self.reasons = reasons if reasons is not None else [message] * len(bad)


@dataclass(eq=False)
class Ticket:
    """A batch given to :meth:`Graph.submit`: its inputs (held, since DALI reads them in place), and its state.

    ``live``: fed and scheduled in the graph, its output not yet taken. ``error``: it failed before it was fed.
    """

    images: list[np.ndarray]
    params: dict[str, list[np.ndarray]]
    live: bool = False
    error: GraphError | None = None


def _dense(values: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """A batch of per-sample parameters as one array where their shapes agree (else the list, as it is).

    DALI takes a dense batch in one copy and a list sample by sample: for the ImageNet spec's three parameters that
    was 0.8 ms of each batch's feed against 0.3 ms, time in which DALI's threads wait.
    """
    first = values[0].shape if values else None
    if first is None or any(v.shape != first for v in values):
        return values
    return np.stack(values)


def _reason(err: BaseException) -> str:
    """The informative part of a DALI error, which wraps it in the pipeline definition's traceback."""
    text = str(err)
    operator = re.search(r"operator `([^`]+)`", text)
    detail = text.split("encountered:", 1)[-1]
    lines = [line.strip() for line in detail.splitlines()]
    kept = [
        line
        for line in lines
        if line and not line.startswith(("Critical error", "Current pipeline object", "C++ context", "File "))
    ]
    message = " ".join(kept).rstrip(" :") or repr(err)
    return f"{operator.group(1)}: {message}" if operator else message


def _retire(pipe: Any, scheduled: int) -> None:
    """Wait for the ``scheduled`` batches still in ``pipe`` (a failure does not stop them), then shut it down now.

    Not left to ``del``: the failure's traceback holds the pipeline (DALI's ``outputs`` frame), so it would be torn
    down later, while its replacement runs. ``_shutdown`` is what DALI's own ``__del__`` and exit hook call.
    """
    for _ in range(scheduled):
        try:
            pipe.outputs()
        except (RuntimeError, IndexError, StopIteration):  # the batch's own failure, or none left: it is redone
            continue
    pipe._shutdown()


def _pil_decodes(data: np.ndarray, exif: Exif) -> bool:
    """Whether DALI would decode ``data`` otherwise than PIL (see the module docstring); the reader checked it."""
    if data.size > 2 and data[0] == 0xFF and data[1] == 0xD8:  # JPEG: both decode it alike; the common case
        return False
    header = read_header(data, sys.maxsize)
    return header.depth > 8 or (exif == "ignore" and header.format == "tiff" and header.orientation in range(2, 9))


def _as_pil_decodes(data: np.ndarray, exif: Exif) -> np.ndarray:
    """PIL's ``convert("RGB")`` pixels of an image (turned if ``exif="apply"``), as an 8-bit PNG."""
    from PIL import Image, ImageOps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the header check applied max_pixels
        image: Image.Image = Image.open(io.BytesIO(data.tobytes()))
        if exif == "apply":
            image = ImageOps.exif_transpose(image)
        out = io.BytesIO()
        image.convert("RGB").save(out, "PNG", compress_level=1)
    return np.frombuffer(out.getvalue(), np.uint8)


class Graph:
    """A built DALI pipeline for one compiled spec; :meth:`run` takes one batch of host inputs.

    Args:
        compiled: the checked transform spec.
        batch_size: the largest batch :meth:`run` will be given.
        num_threads: DALI's CPU worker threads.
        device_id: ``None`` for DALI's CPU operators, else the CUDA device that decodes (nvJPEG) and transforms.
        encoded: inputs are encoded images (else HWC uint8 pixels).
        exif: ``"ignore"`` decodes the stored pixels; ``"apply"`` turns each image by its EXIF orientation.
        seed: seeds DALI's own random operators (only the auto-augment policies use them; every other random
            parameter comes from the sample-keyed generator and is fed in).
        pin_memory: copy each CPU batch into page-locked memory (on the graph's thread, off the training loop).
    """

    def __init__(
        self,
        compiled: CompiledTransforms,
        *,
        batch_size: int,
        num_threads: int,
        device_id: int | None,
        encoded: bool,
        seed: int = 0,
        exif: Exif = "ignore",
        pin_memory: bool = False,
    ):
        self.pin_memory = pin_memory
        self.compiled, self.batch_size, self.num_threads = compiled, batch_size, num_threads
        self.device_id, self.encoded, self.seed, self.exif = device_id, encoded, seed, exif
        self._pipe = self._build(batch_size)
        self._flying: deque[Ticket] = deque()  # live tickets, oldest first: their outputs come in this order
        # Held by the one pass that uses the graph: a pass ended from outside (a new iter(), set_epoch, a dropped
        # iterator) finishes and drains its batches before the next pass feeds any.
        self.lock = threading.Lock()
        self._probe: Any = None
        self._good: tuple[np.ndarray, dict[str, list[np.ndarray]]] | None = None  # a sample that ran, to tell a
        # batch of bad samples from a broken graph

    def _build(self, batch_size: int) -> Any:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def

        compiled, encoded, adjust_orientation = self.compiled, self.encoded, self.exif == "apply"
        device: Literal["cpu", "gpu"] = "cpu" if self.device_id is None else "gpu"

        @pipeline_def(
            batch_size=batch_size,
            num_threads=self.num_threads,
            device_id=self.device_id,
            seed=self.seed % (1 << 31),
            exec_dynamic=True,  # outputs stay valid while torch holds them, so DLPack needs no copy
            prefetch_queue_depth=1,  # no prefetch of its own: the graph stage schedules the next batch itself
            enable_conditionals=compiled.conditionals,  # the auto-augment policies choose operations per sample
        )
        def pipeline() -> Any:
            # no_copy: DALI reads the samples where they lie (a shard's map, a file's bytes) instead of copying the
            # batch first (2 ms of each 64-image batch, while DALI's threads waited); run() holds them until it returns.
            source = fn.external_source(name="images", dtype=types.UINT8, layout=None if encoded else "HWC",
                                        no_copy=True)
            params = {
                name: fn.external_source(name=name, dtype=dali_type(kind))
                for name, kind in compiled.param_inputs.items()
            }
            return compiled.build(
                source, params, device=device, encoded=encoded, adjust_orientation=adjust_orientation
            )

        pipe = pipeline()
        pipe.build()
        return pipe

    def _feed(self, pipe: Any, images: list[np.ndarray], params: dict[str, list[np.ndarray]]) -> None:
        pipe.feed_input("images", images)
        for name, values in params.items():
            pipe.feed_input(name, _dense(values))

    def _run_on(self, pipe: Any, images: list[np.ndarray], params: dict[str, list[np.ndarray]]) -> Any:
        """One batch through ``pipe`` with nothing else in it: ``run()``'s steps, on the API :meth:`submit` uses.

        Not ``pipe.run()``: DALI refuses to mix it with ``schedule_run``/``outputs`` on one pipeline ("Mixing pipeline
        API type"), and a batch run alone shares the pipeline with the batches submitted after it.
        """
        self._feed(pipe, images, params)
        pipe.schedule_run()
        (out,) = pipe.outputs()
        return out

    def run(self, images: list[np.ndarray], params: dict[str, list[np.ndarray]]) -> torch.Tensor:
        """The transformed batch as a torch tensor on the graph's device, in the spec's dtype and layout.

        :meth:`submit` then :meth:`collect`; no other batch may be in the graph.

        Raises:
            GraphError: DALI failed; the graph is rebuilt and each sample retried alone to name the bad ones (all
                of them when every sample fails alone, while a sample that ran before still runs).
            RuntimeError: every sample fails, and so does a sample that ran before: the graph, not the data, fails.
                Or an image left to PIL (16-bit, or a turned TIFF) that PIL cannot decode (named by its position).
        """
        if self._flying:
            raise RuntimeError("Graph.run with batches in the graph: collect or drain them first")
        return self.collect(self.submit(images, params))

    def submit(self, images: list[np.ndarray], params: dict[str, list[np.ndarray]]) -> Ticket:
        """Feed a batch and schedule it behind the batches already in the graph; :meth:`collect` takes its output.

        Nothing is raised here: a failure is raised by :meth:`collect`, in the batches' order.
        """
        try:
            ticket = Ticket(self._decodable(images) if self.encoded else images, params)
        except GraphError as err:
            return Ticket(images, params, error=err)
        self._schedule(ticket)
        return ticket

    def _schedule(self, ticket: Ticket) -> None:
        try:
            self._feed(self._pipe, ticket.images, ticket.params)
            self._pipe.schedule_run()
        except RuntimeError:  # a pipeline that refuses a feed is broken: the batch runs alone when collected
            self._reset()
            return
        ticket.live = True
        self._flying.append(ticket)

    def collect(self, ticket: Ticket) -> torch.Tensor:
        """The output of ``ticket``, the oldest batch submitted and not collected (see :meth:`run` for errors).

        DALI reports a failure at the output it was waiting for, which may be a later batch's: the batch runs again
        alone, and only if it fails alone is it the one at fault; the later batches are then fed again, in order.
        """
        if ticket.error is not None:
            raise ticket.error
        if not ticket.live:
            return self._first(ticket, broken=False)
        if not self._flying or self._flying[0] is not ticket:
            raise RuntimeError("Graph.collect: batches are collected in the order they were submitted")
        try:
            (out,) = self._pipe.outputs()
        except RuntimeError:
            self._flying.popleft()
            ticket.live = False
            return self._first(ticket, broken=True)
        self._flying.popleft()
        ticket.live = False
        self._good = ticket.images[0], {name: values[:1] for name, values in ticket.params.items()}
        return self._to_torch(out)

    def drain(self) -> None:
        """Take every batch still in the graph and drop its output (a pass stopped, or a batch given back)."""
        while self._flying:
            ticket = self._flying.popleft()
            ticket.live = False
            try:
                self._pipe.outputs()
            except RuntimeError:
                self._reset()

    def _reset(self) -> None:
        """A new pipeline in place of a failed one (DALI: "no longer valid" after a failure); nothing is in it.

        The failed one is retired first (:func:`_retire`), so that no batch still runs in a pipeline being dropped
        and no pipeline is torn down while the next one is built or runs: either crashed the process (SIGSEGV, in 6
        of 66 runs over a folder of hostile images under ``on_error="skip"``). The batches that were in it are fed
        again by the caller, so their outputs are waited for here and dropped.
        """
        scheduled = len(self._flying)
        for ticket in self._flying:
            ticket.live = False
        self._flying.clear()
        _retire(self._pipe, scheduled)
        self._pipe = self._build(self.batch_size)

    def _first(self, ticket: Ticket, *, broken: bool) -> torch.Tensor:
        """Run ``ticket`` alone, before the batches in the graph, which are fed again after it unless it fails."""
        later = list(self._flying)
        if later or broken:
            self._reset()
        output = self._alone(ticket)  # raises when this batch is the one at fault: the later ones stay out
        for other in later:
            self._schedule(other)
        return output

    def _alone(self, ticket: Ticket) -> torch.Tensor:
        """Run ``ticket``'s batch with nothing else in the graph; name its bad samples if it fails."""
        images, params = ticket.images, ticket.params
        try:
            out = self._run_on(self._pipe, images, params)
        except RuntimeError as err:
            self._reset()
            bad, reasons = self._find_bad(images, params)
            if len(bad) == len(images) and self._good is not None:
                good_image, good_params = self._good
                if self._find_bad([good_image], good_params)[0]:
                    raise RuntimeError(
                        f"the DALI graph fails on a sample it ran before, so the graph fails, not the data: "
                        f"{_reason(err)}"
                    ) from err
            raise GraphError(_reason(err), bad, reasons) from err
        self._good = images[0], {name: values[:1] for name, values in params.items()}
        return self._to_torch(out)

    def _decodable(self, images: list[np.ndarray]) -> list[np.ndarray]:
        """``images`` with each image DALI decodes otherwise replaced by PIL's pixels of it (the module docstring)."""
        deep = [_pil_decodes(data, self.exif) for data in images]
        if not any(deep):
            return images
        out, bad = list(images), []
        for i, data in enumerate(images):
            if deep[i]:
                try:
                    out[i] = _as_pil_decodes(data, self.exif)
                except Exception as err:  # noqa: BLE001 - PIL raises many types for bad input; each names the sample
                    bad.append((i, f"{type(err).__name__}: {err}"))
        if bad:
            raise GraphError(f"PIL cannot decode this image ({bad[0][1]})", [i for i, _ in bad])
        return out

    def _find_bad(
        self, images: list[np.ndarray], params: dict[str, list[np.ndarray]]
    ) -> tuple[list[int], list[str]]:
        bad, reasons = [], []
        for i in range(len(images)):
            if self._probe is None:
                self._probe = self._build(1)
            try:
                self._run_on(self._probe, [images[i]], {name: [values[i]] for name, values in params.items()})
            except RuntimeError as err:
                bad.append(i)
                reasons.append(_reason(err))
                _retire(self._probe, 0)
                self._probe = None
        return bad, reasons

    def _to_torch(self, out: Any) -> torch.Tensor:
        tensor = torch.from_dlpack(out.as_tensor())
        if self.compiled.dtype == "bfloat16":
            tensor = tensor.to(torch.bfloat16)
        if self.compiled.layout == "channels_last":
            tensor = tensor.permute(0, 3, 1, 2)  # NCHW shape over NHWC memory: torch.channels_last
        if self.pin_memory and tensor.device.type == "cpu":
            tensor = tensor.pin_memory()
        return tensor
