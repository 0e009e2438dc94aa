"""What the Loader hands over: dtype, layout, device, labels, and the clock's spans."""

from pathlib import Path

import pytest
import torch

from stallfree import Loader
from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(16), RandomHorizontalFlip(), Normalize()]


def first_batch(source: Path, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    kwargs.setdefault("transform", SPEC)
    return next(iter(Loader(source, batch_size=4, num_threads=1, seed=1, **kwargs)))


@pytest.mark.parametrize(
    ("dtype", "torch_dtype"),
    [("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)],
)
def test_float_dtypes_agree_with_float32(indexed_list: Path, dtype: str, torch_dtype: torch.dtype) -> None:
    reference, _ = first_batch(indexed_list)
    images, labels = first_batch(indexed_list, dtype=dtype)
    assert images.dtype == torch_dtype and labels.dtype == torch.int64
    tolerance = {"float32": 0, "float16": 2e-3, "bfloat16": 2e-2}[dtype]
    torch.testing.assert_close(images.float(), reference, atol=tolerance * 3, rtol=tolerance)


def test_uint8_output_is_unnormalised_pixels(indexed_list: Path) -> None:
    images, _ = first_batch(indexed_list, transform=SPEC[:2], dtype="uint8")
    reference, _ = first_batch(indexed_list)
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 16, 16)
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    torch.testing.assert_close((images.float() / 255 - mean) / std, reference, atol=0.03, rtol=0)


@pytest.mark.parametrize("layout", ["NHWC", "channels_last"])
def test_layouts(indexed_list: Path, layout: str) -> None:
    reference, _ = first_batch(indexed_list)
    images, _ = first_batch(indexed_list, layout=layout)
    if layout == "NHWC":
        assert images.shape == (4, 16, 16, 3)
        assert torch.equal(images.permute(0, 3, 1, 2), reference)
    else:
        assert images.shape == (4, 3, 16, 16) and images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(images, reference)


def test_cpu_device_and_labels(image_folder: Path) -> None:
    loader = Loader(image_folder, batch_size=6, transform=SPEC, shuffle=False, num_threads=1)
    images, labels = next(iter(loader))
    assert images.device.type == "cpu" and labels.tolist() == [0] * 6
    assert loader.classes == ["circle", "square", "triangle"]


def test_cuda_without_a_gpu_is_a_clear_error(indexed_list: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="device cuda: torch sees no CUDA GPU on this machine"):
        Loader(indexed_list, batch_size=4, transform=SPEC, device="cuda")


class ListClock:
    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float, int | None]] = []

    def record(self, stage: str, state: str, start: float, end: float, batch: int | None = None) -> None:
        self.spans.append((stage, state, start, end, batch))


def test_every_stage_reports_to_the_clock(indexed_list: Path) -> None:
    clock = ListClock()
    loader = Loader(indexed_list, batch_size=5, transform=SPEC, num_threads=1, clock=clock)
    assert len(list(loader)) == 8
    by_stage: dict[tuple[str, str], list[int | None]] = {}
    for stage, state, start, end, batch in clock.spans:
        assert end >= start
        by_stage.setdefault((stage, state), []).append(batch)
    assert sorted(by_stage) == [("augment", "busy"), ("input", "waiting"), ("read", "busy")]
    assert all(sorted(batches) == list(range(8)) for batches in by_stage.values())


@pytest.mark.gpu
@pytest.mark.parametrize("placement", ["gpu", "cpu"])
def test_cuda_output_matches_cpu(indexed_list: Path, placement: str) -> None:
    reference, ref_labels = first_batch(indexed_list, transform=SPEC[:2], dtype="uint8")
    images, labels = first_batch(indexed_list, transform=SPEC[:2], dtype="uint8", device="cuda", placement=placement)
    assert images.device.type == "cuda" and labels.device.type == "cuda"
    assert torch.equal(labels.cpu(), ref_labels)
    # nvJPEG and libjpeg-turbo may round differently; resizing on the GPU likewise.
    assert (images.cpu().int() - reference.int()).abs().float().mean() < 2.0


@pytest.mark.slow
def test_exiting_mid_epoch_does_not_abort_the_process(indexed_list: Path) -> None:
    # Guards against "terminate called without an active exception": DALI's exit hook tearing down a pipeline
    # that a Loader thread is still running.
    import subprocess
    import sys

    script = (
        "from stallfree import Loader\n"
        "from stallfree.transforms import CenterCrop\n"
        f"it = iter(Loader({str(indexed_list)!r}, batch_size=2, transform=[CenterCrop(8)], prefetch=4))\n"
        "next(it)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr
