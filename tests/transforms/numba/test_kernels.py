"""The kernel API: a user-defined kernel from definition to training batch, and its build-time errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stallfree import Loader
from stallfree.transforms import KernelError, KernelTransform, Normalize, Resize, kernel
from stallfree.transforms.random import SampleRandom


# The docs' example (docs/kernels.md): drop one random colour channel per sample.
@kernel
def drop_channel(out, image, y, x, channel):  # noqa: ANN001, ANN201 - Numba-compiled: no annotations needed
    for c in range(image.shape[2]):
        out[y, x, c] = 0 if c == channel[0] else image[y, x, c]


@dataclass(frozen=True)
class RandomChannelDrop(KernelTransform):
    p: float = 1.0
    kernel = drop_channel
    params = {"channel": np.int32}

    def sample(self, rng: SampleRandom, size: tuple[int, int]) -> dict[str, Any]:
        return {"channel": rng.integers(0, 3) if rng.random() < self.p else -1}


@kernel
def broken(out, image, y, x, amount):  # noqa: ANN001, ANN201
    out[y, x, 0] = image[y, x, 0] + "a string"


@dataclass(frozen=True)
class Broken(KernelTransform):
    kernel = broken
    params = {"amount": np.float32}

    def sample(self, rng: SampleRandom, size: tuple[int, int]) -> dict[str, Any]:
        return {"amount": 1.0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stallfree.ingest.synthetic import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("kern"), num_classes=2, per_class=6, size=(32, 32), seed=1)


def test_user_kernel_from_definition_to_training_batch(folder: Path) -> None:
    spec = [Resize((24, 24)), RandomChannelDrop(), Normalize(mean=(0, 0, 0), std=(1, 1, 1))]
    loader = Loader(folder, batch_size=4, transform=spec, shuffle=True, seed=3, num_threads=1)
    batches = [(images.clone(), labels.clone()) for images, labels in loader]
    assert len(batches) == 3
    for images, labels in batches:
        assert images.shape == (4, 3, 24, 24) and images.dtype == torch.float32 and labels.dtype == torch.int64
        zero = (images.flatten(2).abs().amax(-1) == 0)  # (batch, channel): channels that are all zero
        assert zero.sum(1).tolist() == [1, 1, 1, 1]  # exactly one channel dropped in every sample
    loader.set_epoch(0)
    again = [images for images, _ in loader]
    assert all(torch.equal(a, b) for a, (b, _) in zip(again, batches, strict=True))  # keyed by (seed, epoch, sample)


def test_user_kernel_outside_the_graph() -> None:
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    out = RandomChannelDrop().apply(image, {"channel": 1})
    assert (out[..., 1] == 0).all() and np.array_equal(out[..., [0, 2]], image[..., [0, 2]])
    assert np.array_equal(drop_channel(image, np.int32(-1)), image)


def test_compile_error_names_the_kernel_and_numbas_reason_before_any_batch(folder: Path) -> None:
    with pytest.raises(KernelError, match=r"kernel 'broken' does not compile with numba.njit.*(add|str)"):
        Loader(folder, batch_size=4, transform=[Resize((24, 24)), Broken()], num_threads=1)


def test_prepare_compiles_when_the_spec_is_checked() -> None:
    from stallfree.transforms.spec import GraphState

    RandomChannelDrop().prepare(GraphState("cpu", "float32"))
    with pytest.raises(KernelError, match=r"kernel 'broken' does not compile .* for a float32 image"):
        Broken().prepare(GraphState("cpu", "float32"))


def test_decorator_checks_the_signature() -> None:
    with pytest.raises(TypeError, match=r"must take \(out, image, y, x, \*params\)"):
        kernel(lambda out, image: None)
    with pytest.raises(TypeError, match=r"must take \(out, image, y, x, \*params\)"):
        kernel(lambda out, image, y, x, *rest: None)
    named = kernel(name="dropper")(drop_channel.pixel)
    assert named.name == "dropper" and named.param_names == ("channel",)


def test_params_must_name_the_kernels_arguments() -> None:
    @dataclass(frozen=True)
    class Misnamed(KernelTransform):
        kernel = drop_channel
        params = {"chan": np.int32}

        def sample(self, rng: SampleRandom, size: tuple[int, int]) -> dict[str, Any]:
            return {"chan": 0}

    with pytest.raises(KernelError, match=r"params names \['chan'\] but kernel 'drop_channel' takes \['channel'\]"):
        Misnamed().apply(np.zeros((2, 2, 3), np.uint8), {"chan": 0})
