"""Bad files and bad arguments: a clear error naming the file and sample, or a listed skip; never a crash."""

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import BadSampleError, Loader
from stallfree.ingest.images import BadImage, read_header
from stallfree.transforms import CenterCrop, Normalize, RandomResizedCrop


def jpeg_bytes(mode: str = "RGB", size: tuple[int, int] = (24, 32)) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, "JPEG")
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def bad_jpeg_precision() -> bytes:
    """Passes the header checks but fails inside DALI's decoder (a JPEG claiming 3-bit samples)."""
    data = bytearray(jpeg_bytes())
    data[data.find(b"\xff\xc0") + 4] = 3
    return bytes(data)


BAD = {
    "missing.jpg": None,
    "empty.jpg": b"",
    "truncated.jpg": jpeg_bytes()[:300],
    "text.jpg": b"this is not an image\n",
    "bomb.png": png_claiming(100_000, 100_000),
    "precision.jpg": bad_jpeg_precision(),
}
REASONS = {
    "missing.jpg": "missing file",
    "empty.jpg": "empty file",
    "truncated.jpg": "truncated JPEG",
    "text.jpg": "not an image the Loader decodes",
    "bomb.png": "decompression bomb",
    "precision.jpg": "decoding failed",
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Good images (RGB, grayscale and CMYK JPEG, PNG with alpha) mixed with every kind of bad file."""
    root = tmp_path_factory.mktemp("bad")
    good = {"rgb.jpg": jpeg_bytes(), "gray.jpg": jpeg_bytes("L"), "cmyk.jpg": jpeg_bytes("CMYK")}
    buffer = io.BytesIO()
    Image.fromarray(np.full((20, 20, 4), 200, np.uint8)).save(buffer, "PNG")
    good["rgba.png"] = buffer.getvalue()
    lines = ["path,label"]
    for i, (name, data) in enumerate([*good.items(), *BAD.items()]):
        if data is not None:
            (root / name).write_bytes(data)
        lines.append(f"{name},{i}")
    (root / "list.csv").write_text("\n".join(lines))
    return root / "list.csv"


def loader(source: Path, **kwargs) -> Loader:
    return Loader(source, batch_size=4, transform=[CenterCrop(16)], shuffle=False, dtype="uint8", num_threads=1,
                  **kwargs)


def test_skip_finishes_the_epoch_and_lists_each_bad_sample(dataset: Path) -> None:
    loaded = loader(dataset, on_error="skip")
    batches = list(loaded)
    labels = torch.cat([labels for _, labels in batches]).tolist()
    assert len(batches) == len(loaded) == 3
    assert labels == [0, 1, 2, 3] * 2 + [0, 1], "the good images, in order, wrapping round to fill the batches"
    assert all(images.shape[1:] == (3, 16, 16) for images, _ in batches)
    by_file = {Path(s["source"]).name: s["reason"] for s in loaded.skipped}
    assert by_file.keys() == BAD.keys()
    for name, reason in REASONS.items():
        assert reason in by_file[name], (name, by_file[name])


@pytest.mark.parametrize("name", list(BAD))
def test_raise_names_the_file_and_sample(dataset: Path, name: str) -> None:
    # Beside the files: a list's paths must lie inside its folder.
    (dataset.parent / f"one-{name}.csv").write_text(f"path,label\nrgb.jpg,0\n{name},1\n")
    with pytest.raises(BadSampleError, match=rf"{name} \(sample 1\): .*{REASONS[name]}"):
        list(loader(dataset.parent / f"one-{name}.csv"))


def test_loader_still_works_after_a_failed_epoch(dataset: Path) -> None:
    (dataset.parent / "precision-only.csv").write_text("path,label\nprecision.jpg,0\n")
    broken = loader(dataset.parent / "precision-only.csv")
    with pytest.raises(BadSampleError):
        list(broken)
    (dataset.parent / "rgb-only.csv").write_text("path,label\nrgb.jpg,0\n")
    assert len(list(loader(dataset.parent / "rgb-only.csv"))) == 1


def test_odd_colour_images_decode_to_rgb_as_pil_converts(dataset: Path) -> None:
    ((images, labels),) = list(loader(dataset, on_error="skip", layout="NHWC"))[:1]
    for img, name in zip(images, ["rgb.jpg", "gray.jpg", "cmyk.jpg", "rgba.png"], strict=True):
        ref = np.asarray(Image.open(dataset.parent / name).convert("RGB"), np.int16)
        h, w = ref.shape[:2]
        top, left = int(round((h - 16) / 2.0)), int(round((w - 16) / 2.0))
        assert np.abs(img.numpy().astype(np.int16) - ref[top : top + 16, left : left + 16]).max() <= 1, name


def test_header_reader() -> None:
    header = read_header(jpeg_bytes(size=(24, 32)))
    assert (header.format, header.height, header.width, header.channels) == ("jpeg", 24, 32, 3)
    assert read_header(jpeg_bytes("L")).channels == 1
    with pytest.raises(BadImage, match="more than max_pixels=100"):
        read_header(jpeg_bytes(), max_pixels=100)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be a positive int"),
        ({"num_threads": -1}, ValueError, "num_threads must be positive"),
        ({"on_error": "ignore"}, ValueError, "on_error must be"),
        ({"echo_mode": "epoch"}, ValueError, "echo_mode must be"),
        ({"echo": 0}, ValueError, "echo must be an int >= 1"),
        ({"dtype": "int7"}, ValueError, "dtype must be one of"),
        ({"layout": "CHWN"}, ValueError, "layout must be one of"),
        ({"device": "tpu"}, ValueError, "device 'tpu' is not a device: use cpu, cuda or cuda:N"),
        ({"device": "mps"}, ValueError, r"device 'mps': stallfree runs on cpu or cuda\[:N\], not mps"),
        ({"transform": [Normalize()]}, ValueError, "same size"),
        ({"transform": [RandomResizedCrop(8), Normalize()], "dtype": "uint8"}, ValueError, "uint8"),
        ({"transform": ["RandomCrop"]}, TypeError, "not a stallfree transform"),
        # issue 10 item 20: echo=0 with echo_mode="batch" constructed, then len() raised ZeroDivisionError
        ({"echo": 0, "echo_mode": "batch"}, ValueError, "echo must be an int >= 1"),
        ({"echo": 1.5}, ValueError, "echo must be an int >= 1"),
        ({"batch_size": True}, ValueError, "batch_size must be a positive int"),
        ({"batch_size": 4.0}, ValueError, "batch_size must be a positive int"),
        ({"shuffle": "yes"}, ValueError, "shuffle must be True \\(or 'global'\\), 'block' .* or False"),
        ({"drop_last": 1}, ValueError, "drop_last must be True or False"),
        ({"seed": 1.5}, ValueError, "seed must be an int"),
        ({"prefetch": 0}, ValueError, "prefetch must be an int >= 1"),
        ({"io_threads": 2.0}, ValueError, "io_threads must be an int >= 1"),
        ({"num_threads": 0}, ValueError, "num_threads must be positive"),
        ({"max_pixels": 0}, ValueError, "max_pixels must be a positive int"),
        ({"placement": "tpu"}, ValueError, "placement must be"),
        ({"rank": -1, "world_size": 2}, ValueError, "rank must be an int in"),
        ({"rank": 2, "world_size": 2}, ValueError, r"rank must be an int in \[0, world_size\)"),
        ({"rank": 0, "world_size": 0}, ValueError, "world_size must be an int >= 1"),
        ({"columns": "key"}, ValueError, r"columns must be a list of column names, e.g. columns=\['key'\]"),
        ({"clock": object()}, ValueError, "clock must have a record"),
        ({"pin_memory": "yes"}, ValueError, "pin_memory must be True or False"),
        ({"channels": 4}, ValueError, r"channels must be 1 \(grayscale\) or 3"),
    ],
)
def test_bad_arguments_fail_before_any_work(dataset: Path, kwargs: dict, error: type, match: str) -> None:
    kwargs = {"batch_size": 4, "transform": [CenterCrop(8)], **kwargs}
    with pytest.raises(error, match=match):
        Loader(dataset, **kwargs)


def test_missing_and_empty_datasets_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Loader(tmp_path / "nowhere", 4, transform=[CenterCrop(8)])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no class sub-folders"):
        Loader(tmp_path / "empty", 4, transform=[CenterCrop(8)])
    (tmp_path / "empty.csv").write_text("path,label\n")
    with pytest.raises(ValueError, match="no rows"):
        Loader(tmp_path / "empty.csv", 4, transform=[CenterCrop(8)])
    (tmp_path / "nolabel.csv").write_text("path\na.jpg\n")
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['label'\]"):
        Loader(tmp_path / "nolabel.csv", 4, transform=[CenterCrop(8)])


def test_dataset_without_targets_is_told_the_keyword_that_exists() -> None:
    class Unlabelled(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int) -> tuple[bytes, int]:
            return jpeg_bytes(), 0

    # issue 10 item 20: the Loader said "pass labels=[...]", a keyword the Loader does not have
    with pytest.raises(ValueError, match=r"Loader\(stallfree.DatasetReader\(dataset, labels=\[\.\.\.\]\)"):
        Loader(Unlabelled(), 2, transform=[CenterCrop(8)])
