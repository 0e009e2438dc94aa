"""What `transform=` accepts besides a list: Compose, one step, and the refusal of Python code, named."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from stallfree.transforms import CenterCrop, Compose, Normalize, RandomHorizontalFlip, Resize
from stallfree.transforms.translation.translator import to_steps


def test_compose_one_step_and_lists_flatten_to_the_same_spec() -> None:
    steps = (Resize(20), CenterCrop(16), RandomHorizontalFlip(), Normalize())
    nested = Compose([Resize(20), Compose([CenterCrop(16), [RandomHorizontalFlip()]]), Normalize()])
    assert to_steps(nested).steps == steps
    assert to_steps(list(steps)).steps == steps
    assert to_steps(CenterCrop(16)).steps == (CenterCrop(16),)
    assert to_steps(None).steps == () and to_steps(nested).dtype is None


def test_compose_takes_a_list() -> None:
    with pytest.raises(TypeError, match=r"Compose takes a list of transforms, got CenterCrop: Compose\(\[Center"):
        Compose(CenterCrop(16))  # type: ignore[arg-type]


class Brighten:
    def __call__(self, image):
        return image


def test_a_lambda_is_refused_with_where_it_is_and_the_kernel_recipe() -> None:
    with pytest.raises(TypeError, match=r"transform\[1\] is a lambda defined at .*test_spec_input.py:\d+: .*@kernel"):
        to_steps([CenterCrop(16), lambda image: image])


def test_a_custom_class_is_refused_by_its_name() -> None:
    with pytest.raises(TypeError, match=r"transform\[0\]\[1\] is .*test_spec_input.Brighten: .*KernelTransform"):
        to_steps(Compose([Compose([CenterCrop(16), Brighten()])]))


@pytest.mark.slow
def test_no_torchvision_is_imported_for_stallfree_specs() -> None:
    code = (
        "import sys, stallfree; from stallfree.transforms import *; "
        "from stallfree.transforms.translation.translator import to_steps; "
        "to_steps(Compose([Resize(8), CenterCrop(8), Normalize()])); "
        "assert not [m for m in sys.modules if m.startswith('torchvision')], 'torchvision imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_normalize_warns_on_dali_style_0_255_means() -> None:
    with pytest.warns(UserWarning, match=r"0-255 convention.*Normalize\(mean=\(0.485, 0.456, 0.406\)"):
        Normalize(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Normalize()  # torchvision's own scale: no warning


def test_normalize_broadcasts_one_value_as_torchvision() -> None:
    from stallfree.transforms.spec import GraphState

    assert Normalize((0.5,), (0.25,)).scaled(GraphState("cpu", "float32")) == ([0.5] * 3, [0.25] * 3)
    with pytest.raises(ValueError, match="1 or 3 values"):
        Normalize((0.5, 0.5), (0.5, 0.5))
