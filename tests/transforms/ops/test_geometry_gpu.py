"""On a real GPU: the geometric steps and the containers in DALI's GPU graph against the CPU graph (marked `gpu`).

The CPU graph equals torchvision's PIL output (test_geometry, test_interpolation, test_warp, test_containers); on
the GPU, crops, padding with a fill and the containers are the same operators and give the same pixels, and the
warps run DALI's warp_perspective, compared here with the same operator on DALI's CPU backend (whose distance from
PIL test_warp bounds).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stallfree.transforms import CenterCrop, ColorJitter, RandomHorizontalFlip, RandomVerticalFlip, Resize
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.dali_types import dali_type
from stallfree.transforms.ops.containers import RandomApply, RandomChoice, RandomOrder
from stallfree.transforms.ops.geometry import Pad, RandomCrop, RandomZoomOut
from stallfree.transforms.ops.warp import RandomAffine, RandomPerspective, RandomRotation, dali_warp
from stallfree.transforms.random import batch_random

pytestmark = pytest.mark.gpu
GPU = "gpu"  # the device the graph under test runs on


def run_graph(steps: list[Any], images: list[np.ndarray], device: str) -> list[np.ndarray]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    compiled = CompiledTransforms(steps, dtype="uint8", layout="NHWC")

    @pipeline_def(batch_size=len(images), num_threads=2, device_id=0 if device == "gpu" else None,
                  exec_dynamic=True, enable_conditionals=compiled.conditionals)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        params = {n: fn.external_source(name=n, dtype=dali_type(k)) for n, k in compiled.param_inputs.items()}
        return compiled.build(source, params, device=device, encoded=False)  # type: ignore[arg-type]

    p = pipe()
    p.build()
    params = compiled.draw(batch_random(3, 0, range(len(images))), [im.shape[:2] for im in images])
    p.feed_input("images", images)
    for name, values in params.items():
        p.feed_input(name, values)
    (out,) = p.run()
    if device == "gpu":
        out = out.as_cpu()
    return [np.array(out[i]) for i in range(len(images))]


def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, s, dtype=np.uint8) for s in [(48, 40, 3), (30, 52, 3), (33, 33, 3), (64, 64, 3)]]


def test_crops_padding_and_containers_are_the_cpu_graphs_pixels() -> None:
    steps = [RandomZoomOut((5, 6, 7), (1.0, 1.5), p=0.5), RandomCrop(36, padding=4, pad_if_needed=True, fill=9),
             RandomChoice([RandomHorizontalFlip(1.0), Pad(2, fill=(1, 2, 3))]), RandomOrder([RandomVerticalFlip(1.0),
             RandomApply([Pad(1)], p=0.5)]), CenterCrop(32)]
    for c, g in zip(run_graph(steps, images(), "cpu"), run_graph(steps, images(), GPU), strict=True):
        assert np.array_equal(c, g)


def test_colour_inside_random_apply_matches_within_the_kernels_bound() -> None:
    steps = [CenterCrop(32), RandomApply([ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8)]
    for c, g in zip(run_graph(steps, images(), "cpu"), run_graph(steps, images(), GPU), strict=True):
        assert np.abs(c.astype(int) - g.astype(int)).max() <= 1


def test_nearest_resize_on_the_gpu_is_dalis_nearest() -> None:
    # The CPU graph picks PIL's pixels; DALI's nearest on the GPU picks the same but where float rounding decides.
    steps = [Resize((27, 45), interpolation="nearest")]
    for c, g in zip(run_graph(steps, images(), "cpu"), run_graph(steps, images(), GPU), strict=True):
        assert c.shape == g.shape and (c == g).all(-1).mean() > 0.9


@pytest.mark.parametrize("step", [RandomRotation(40, interpolation="bilinear", fill=(3, 4, 5)),
                                  RandomAffine(20, (0.1, 0.1), (0.8, 1.2), 10),
                                  RandomPerspective(0.5, p=1.0)], ids=lambda s: type(s).__name__)
def test_warps_on_the_gpu_equal_the_same_operator_on_the_cpu(step) -> None:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    batch = [np.ascontiguousarray(im[:30, :33]) for im in images()]  # one size: no crop needed after the warp
    gpu = run_graph([step, CenterCrop((30, 33))], batch, GPU)
    drawn = [step.draw(r, im.shape[:2])[0] for r, im in zip(batch_random(3, 0, range(4)), batch, strict=True)]

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def cpu() -> Any:
        params = {"size": fn.external_source(name="size", dtype=types.UINT8),
                  "warp": fn.external_source(name="warp", dtype=types.FLOAT64)}
        image = fn.external_source(name="image", dtype=types.UINT8, layout="HWC")
        return dali_warp(image, params, step.interpolation, (3, 4, 5) if step.fill else (0, 0, 0), "cpu")

    p = cpu()
    p.build()
    p.feed_input("image", batch)
    p.feed_input("size", [d["size"] for d in drawn])
    p.feed_input("warp", [d["warp"] for d in drawn])
    (out,) = p.run()
    for k in range(4):
        diff = np.abs(np.asarray(out[k]).astype(int) - gpu[k].astype(int))
        assert (diff <= 1).mean() > 0.999
