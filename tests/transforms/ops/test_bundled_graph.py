"""The bundled kernels inside a running DALI CPU pipeline give the pixels they give outside it."""

from __future__ import annotations

from typing import Any

import numpy as np

from stallfree.transforms import CenterCrop, GaussianNoise, RandomErasing, RandomGrayscale
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.dali_types import dali_type
from stallfree.transforms.random import batch_random


def run_graph(steps: list[Any], images: list[np.ndarray]) -> tuple[list[np.ndarray], dict[str, list[np.ndarray]]]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    compiled = CompiledTransforms(steps, dtype="uint8", layout="NHWC")

    # enable_conditionals: the policies need it, and DALI's AutoGraph must then leave the Numba functions alone
    @pipeline_def(batch_size=len(images), num_threads=2, device_id=None, exec_dynamic=True, enable_conditionals=True)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        params = {n: fn.external_source(name=n, dtype=dali_type(k)) for n, k in compiled.param_inputs.items()}
        return compiled.build(source, params, device="cpu", encoded=False)

    p = pipe()
    p.build()
    params = compiled.draw(batch_random(9, 1, range(len(images))), [im.shape[:2] for im in images])
    p.feed_input("images", images)
    for name, values in params.items():
        p.feed_input(name, values)
    (out,) = p.run()
    return [np.array(out[i]) for i in range(len(images))], params


def test_bundled_chain_in_graph_equals_outside() -> None:
    rng = np.random.default_rng(0)
    shapes = [(30, 26, 3), (17, 33, 3), (30, 26, 3), (21, 21, 3), (40, 12, 3), (26, 30, 3)]
    images = [rng.integers(0, 256, s, dtype=np.uint8) for s in shapes]
    # Three kernels, one per parameter path (a fill value, a noise key, a flag); every bundled kernel goes through
    # the same Kernel.node wrapping, and each DALI numba_function costs seconds of Numba compilation to build.
    chain = [RandomErasing(p=0.7, value=(200, 10, 90)), GaussianNoise(sigma=0.05), RandomGrayscale(p=0.5)]
    outs, params = run_graph([*chain, CenterCrop((12, 12))], images)
    for i, image in enumerate(images):
        x = image
        for k, step in enumerate(chain):
            x = step.apply(x, {name: params[f"{k}.{name}"][i] for name in step.params})
        top, left = CenterCrop((12, 12)).anchor(*x.shape[:2])
        assert np.array_equal(outs[i], x[top : top + 12, left : left + 12]), i
