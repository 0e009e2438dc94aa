"""ColorJitter inside a running DALI CPU pipeline gives the pixels it gives outside it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from stallfree.transforms import CenterCrop, ColorJitter
from stallfree.transforms.compile import CompiledTransforms
from stallfree.transforms.dali_types import dali_type
from stallfree.transforms.random import batch_random


def run_graph(steps: list[Any], images: list[np.ndarray], seed: int = 0) -> tuple[list[np.ndarray], dict]:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    compiled = CompiledTransforms(steps, dtype="uint8", layout="NHWC")

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None, exec_dynamic=True)
    def pipe() -> Any:
        source = fn.external_source(name="images", dtype=types.UINT8, layout="HWC")
        params = {n: fn.external_source(name=n, dtype=dali_type(k)) for n, k in compiled.param_inputs.items()}
        return compiled.build(source, params, device="cpu", encoded=False)

    p = pipe()
    p.build()
    params = compiled.draw(batch_random(seed, 0, range(len(images))), [im.shape[:2] for im in images])
    p.feed_input("images", images)
    for name, values in params.items():
        p.feed_input(name, values)
    (out,) = p.run()
    return [np.array(out[i]) for i in range(len(images))], params


def test_colorjitter_in_graph_equals_outside() -> None:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (24, 20, 3), dtype=np.uint8) for _ in range(5)]
    jitter = ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    outs, params = run_graph([jitter, CenterCrop((24, 20))], images)
    for i, image in enumerate(images):
        alone = jitter.apply(image, params["0.order"][i], params["0.factors"][i])
        assert np.array_equal(outs[i], alone)
        assert not np.array_equal(outs[i], image)


@pytest.mark.parametrize("jitter", [ColorJitter(), ColorJitter(brightness=0, contrast=0),
                                    ColorJitter(brightness=(1, 1)), ColorJitter(saturation=(1.0, 1.0), hue=0)])
def test_a_colorjitter_that_changes_nothing_is_a_no_op_in_the_loader(image_folder, jitter: ColorJitter) -> None:
    # Regression: the first batch raised KeyError 'Could not find an input operator with name "0.order"'.
    from stallfree import Loader
    from stallfree.transforms import CenterCrop

    plain = list(Loader(image_folder, 8, transform=[CenterCrop(16)], num_threads=1, shuffle=False))
    jittered = list(Loader(image_folder, 8, transform=[jitter, CenterCrop(16)], num_threads=1, shuffle=False))
    assert len(plain) == len(jittered) == 3
    for (a, la), (b, lb) in zip(plain, jittered, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
