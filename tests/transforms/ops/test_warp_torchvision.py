"""torchvision's RandomRotation, RandomAffine and RandomPerspective through the Loader against torchvision itself.

Each sample is compared with torchvision's functional op (F.rotate, F.affine, F.perspective on the PIL image) run
on the parameters drawn from the sample's keyed stream; the draws are compared with torchvision's own by a
two-sample Kolmogorov-Smirnov test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ks import ks_statistic
from PIL import Image

from stallfree import Loader
from stallfree.transforms.ops.warp import RandomAffine, RandomPerspective, RandomRotation
from stallfree.transforms.random import SampleRandom

pytestmark = pytest.mark.torchvision


def api(version: str):
    if version == "v1":
        import torchvision.transforms as T
    else:
        import torchvision.transforms.v2 as T
    return T


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(14)
    for i in range(8):
        h, w = int(rng.integers(20, 34)), int(rng.integers(20, 34))
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        (root / f"class{i % 2}").mkdir(exist_ok=True)
        Image.fromarray(pixels).save(root / f"class{i % 2}" / f"{i:02d}.png")
    return root



KS_BOUND = 1.95 * np.sqrt(2 / 3000)  # the statistic's 0.001 critical value for two samples of 3000


def samples(folder: Path, recipe, seed: int):
    from torchvision.datasets import ImageFolder

    plain = ImageFolder(folder)
    loader = Loader(folder, batch_size=4, transform=recipe, seed=seed, num_threads=1, columns=["index"])
    for images, _labels, extra in loader:
        for image, index in zip(images, extra["index"].tolist(), strict=True):
            yield image, plain[index][0], SampleRandom(seed, 0, index)


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("mode", ["NEAREST", "BILINEAR"])
def test_rotation_equals_torchvision(folder, version, mode) -> None:
    import torchvision.transforms.functional as F

    T = api(version)
    interpolation = getattr(T.InterpolationMode, mode)
    fill = [30, 60, 90]
    to_tensor = T.PILToTensor() if version == "v1" else T.ToImage()
    recipe = T.Compose([T.RandomRotation(45, interpolation=interpolation, expand=True, fill=fill),
                        T.CenterCrop(48), to_tensor])
    ours = RandomRotation(45)
    for image, pil, rng in samples(folder, recipe, 5):
        ref = F.rotate(pil, ours.angle(rng), interpolation, expand=True, fill=fill)
        assert torch.equal(image, F.pil_to_tensor(F.center_crop(ref, [48, 48])))


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("mode", ["NEAREST", "BILINEAR", "BICUBIC"])
def test_affine_equals_torchvision(folder, version, mode) -> None:
    import torchvision.transforms.functional as F

    T = api(version)
    interpolation = getattr(T.InterpolationMode, mode)
    to_tensor = T.PILToTensor() if version == "v1" else T.ToImage()
    args = {"degrees": 30, "translate": (0.1, 0.2), "scale": (0.8, 1.2), "shear": (-8, 8, -4, 4)}
    recipe = T.Compose([T.RandomAffine(**args, interpolation=interpolation, fill=17), T.CenterCrop(20), to_tensor])
    ours = RandomAffine(**args)
    for image, pil, rng in samples(folder, recipe, 6):
        angle, translate, scale, shear = ours.sample(rng, pil.height, pil.width)
        ref = F.affine(pil, angle, list(translate), scale, list(shear), interpolation, fill=17)
        assert torch.equal(image, F.pil_to_tensor(F.center_crop(ref, [20, 20])))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_perspective_equals_torchvision(folder, version) -> None:
    """Exact but for the least-squares solve (numpy's, torchvision's gels): the same float32 coefficients here."""
    import torchvision.transforms.functional as F

    T = api(version)
    to_tensor = T.PILToTensor() if version == "v1" else T.ToImage()
    recipe = T.Compose([T.RandomPerspective(0.6, p=0.75, fill=[5, 6, 7]), T.CenterCrop(20), to_tensor])
    ours = RandomPerspective(0.6, p=0.75)
    for image, pil, rng in samples(folder, recipe, 7):
        ref = pil
        if rng.random() < 0.75:
            start = [[0, 0], [pil.width - 1, 0], [pil.width - 1, pil.height - 1], [0, pil.height - 1]]
            ref = F.perspective(pil, start, ours.corners(rng, pil.height, pil.width), T.InterpolationMode.BILINEAR,
                                fill=[5, 6, 7])
        assert torch.equal(image, F.pil_to_tensor(F.center_crop(ref, [20, 20])))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_draws_match_torchvision_by_ks(version) -> None:
    T = api(version)
    n, pil = 3000, Image.new("RGB", (40, 30))
    torch.manual_seed(0)
    rotation, affine = T.RandomRotation((-20, 50)), T.RandomAffine(15, (0.2, 0.1), (0.7, 1.3), (-5, 5, 0, 9))
    # v2's make_params gives the perspective's coefficients, not its corners, whose draws are v1's get_params.
    theirs_ends = [api("v1").RandomPerspective.get_params(40, 30, 0.5)[1] for _ in range(n)]
    if version == "v1":
        theirs_angle = [T.RandomRotation.get_params(rotation.degrees) for _ in range(n)]
        theirs_affine = [T.RandomAffine.get_params(affine.degrees, affine.translate, affine.scale, affine.shear,
                                                   [40, 30]) for _ in range(n)]
    else:
        theirs_angle = [rotation.make_params([pil])["angle"] for _ in range(n)]
        theirs_affine = []
        for _ in range(n):
            p = affine.make_params([pil])
            theirs_affine.append((p["angle"], p["translate"], p["scale"], p["shear"]))
    ours_rotation = RandomRotation((-20, 50))
    ours_affine = RandomAffine(15, (0.2, 0.1), (0.7, 1.3), (-5, 5, 0, 9))
    ours_angle = [ours_rotation.angle(SampleRandom(0, 0, i)) for i in range(n)]
    ours_aff = [ours_affine.sample(SampleRandom(0, 1, i), 30, 40) for i in range(n)]
    ours_ends = [RandomPerspective(0.5).corners(SampleRandom(0, 2, i), 30, 40) for i in range(n)]
    assert ks_statistic(np.array(ours_angle), np.array(theirs_angle)) < KS_BOUND
    columns = [lambda a: a[0], lambda a: a[1][0], lambda a: a[1][1], lambda a: a[2], lambda a: a[3][0],
               lambda a: a[3][1]]
    for k, column in enumerate(columns):
        ours_k = np.array([column(a) for a in ours_aff], float)
        theirs_k = np.array([column(a) for a in theirs_affine], float)
        assert ks_statistic(ours_k, theirs_k) < KS_BOUND, f"affine parameter {k}"
    for corner in range(4):
        for axis in range(2):
            ours_k = np.array([e[corner][axis] for e in ours_ends], float)
            theirs_k = np.array([e[corner][axis] for e in theirs_ends], float)
            assert ks_statistic(ours_k, theirs_k) < KS_BOUND, f"corner {corner} axis {axis}"
