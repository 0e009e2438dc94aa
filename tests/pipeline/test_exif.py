"""EXIF orientation: every source agrees with PIL, without rotation by default and with it under ``exif="apply"``.

The reference is PIL: ``Image.open(f).convert("RGB")`` (what torchvision's ImageFolder gives) for the default
``exif="ignore"``, and ``ImageOps.exif_transpose(Image.open(f)).convert("RGB")`` for ``exif="apply"``. The files
are 64x48 (width x height) JPEGs tagged with orientations 1, 3, 6 and 8, so 6 and 8 are displayed 48x64.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from stallfree import DatasetReader, Loader
from stallfree.ingest.images import read_header
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions
from stallfree.pipeline.shards import ShardReader
from stallfree.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop

ORIENTATIONS = (1, 3, 6, 8)
ROTATED = (5, 6, 7, 8)  # orientations whose displayed image is the stored one turned by a quarter


def oriented(orientation: int, seed: int = 0, fmt: str = "JPEG", size: tuple[int, int] = (64, 48)) -> bytes:
    """A ``size`` (width, height) image with smooth content (so JPEG keeps it) tagged with ``orientation``."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0 : size[1], 0 : size[0]]
    pixels = np.stack([x * 255 // size[0], y * 255 // size[1], (x + y) % 97 + rng.integers(0, 100)], -1)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    extra = {"quality": 95} if fmt == "JPEG" else {}
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, fmt, exif=exif.tobytes(), **extra)
    return buffer.getvalue()


def pil(data: bytes, exif: str) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    return np.asarray((ImageOps.exif_transpose(image) if exif == "apply" else image).convert("RGB"))


def center(pixels: np.ndarray, size: int) -> np.ndarray:
    top, left = (pixels.shape[0] - size) // 2, (pixels.shape[1] - size) // 2  # even differences: no rounding
    return pixels[top : top + size, left : left + size]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """root/o<N>/<k>.jpg: two JPEGs per orientation, one class per orientation, plus list.csv over them."""
    root = tmp_path_factory.mktemp("exif")
    lines = ["path,label"]
    for label, orientation in enumerate(ORIENTATIONS):
        (root / f"o{orientation}").mkdir()
        for k in range(2):
            name = f"o{orientation}/{k}.jpg"
            (root / name).write_bytes(oriented(orientation, seed=label * 2 + k))
            lines.append(f"{name},{label}")
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    return root


def files(folder: Path) -> list[Path]:
    return sorted(folder.glob("o*/*.jpg"))


def rows(source: Any, exif: str, transform: list[Any], **kwargs: Any) -> list[np.ndarray]:
    """Every sample's output in row order, HWC uint8."""
    loader = Loader(source, batch_size=4, transform=transform, shuffle=False, dtype="uint8", layout="NHWC",
                    num_threads=1, exif=exif, **kwargs)  # type: ignore[arg-type]
    return [image.cpu().numpy() for images, _ in loader for image in images]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_the_header_reports_the_stored_size_or_with_apply_the_displayed_one(fmt: str, orientation: int) -> None:
    data = oriented(orientation, fmt=fmt)
    stored = read_header(data)
    assert (stored.height, stored.width) == (48, 64)
    displayed = read_header(data, exif="apply")
    assert (displayed.height, displayed.width) == ((64, 48) if orientation in ROTATED else (48, 64))
    assert displayed.orientation == orientation
    width, height = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).size
    assert (displayed.height, displayed.width) == (height, width)


def test_an_image_without_exif_or_with_an_unknown_orientation_is_not_turned() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48)).save(buffer, "JPEG")
    assert read_header(buffer.getvalue(), exif="apply").orientation == 1
    header = read_header(oriented(9), exif="apply")  # PIL's exif_transpose leaves 9 as it is; so does DALI
    assert (header.height, header.width) == (48, 64)


def test_a_damaged_exif_block_never_breaks_the_header_check() -> None:
    # The EXIF bytes are parsed only under "apply"; whatever they hold, the header is read or BadImage is raised.
    data = bytearray(oriented(6))
    start = data.find(b"Exif\x00\x00") + 6
    rng = np.random.default_rng(0)
    for trial in range(300):
        damaged = bytearray(data)
        for position in rng.integers(start, start + 40, 1 + trial % 6):
            damaged[position] = int(rng.integers(0, 256))
        for fmt in ("jpeg", "png"):
            try:
                header = read_header(bytes(damaged) if fmt == "jpeg" else oriented_png(damaged[start:]), exif="apply")
            except ValueError as err:
                assert type(err).__name__ == "BadImage"
                continue
            assert (header.height, header.width) in ((48, 64), (64, 48))


def oriented_png(tiff: bytes) -> bytes:
    """A 64x48 PNG whose eXIf chunk holds ``tiff``, whatever it is."""
    import struct
    import zlib

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48)).save(buffer, "PNG")
    png = buffer.getvalue()
    chunk = struct.pack(">I", len(tiff)) + b"eXIf" + bytes(tiff) + struct.pack(">I", zlib.crc32(b"eXIf" + tiff))
    return png[:33] + chunk + png[33:]


@pytest.mark.parametrize("exif", ["ignore", "apply"])
def test_folder_and_file_list_agree_with_pil(folder: Path, exif: str) -> None:
    # CenterCrop(40) of the displayed image; a window drawn on the wrong size would be padded with black.
    expected = [center(pil(path.read_bytes(), exif), 40) for path in files(folder)]
    for source in (folder, folder / "list.csv"):
        got = rows(source, exif, [CenterCrop(40)])
        assert len(got) == len(expected) == 8
        for image, reference in zip(got, expected, strict=True):
            np.testing.assert_array_equal(image, reference)


@pytest.mark.parametrize("exif", ["ignore", "apply"])
def test_random_resized_crop_never_fails_on_a_turned_image_and_matches_pil_pixels(
    tmp_path: Path, exif: str
) -> None:
    # A 64x48 JPEG tagged 6 used to fail RandomResizedCrop(32) in most epochs: the window was drawn on 48x64.
    (tmp_path / "a").mkdir()
    items = []
    for k in range(8):
        data = oriented(6, seed=k)
        (tmp_path / "a" / f"{k}.jpg").write_bytes(data)
        items.append(data)
    spec = [RandomResizedCrop(32, scale=(0.2, 1.0)), RandomHorizontalFlip()]
    loader = Loader(tmp_path, batch_size=8, transform=spec, seed=5, dtype="uint8", num_threads=1, exif=exif)
    # The same windows on PIL's own pixels (a Dataset of decoded images) give the same batches.
    reference = Loader(Decoded(items, exif), batch_size=8, transform=spec, seed=5, dtype="uint8", num_threads=1)
    for epoch in range(12):
        loader.set_epoch(epoch)
        reference.set_epoch(epoch)
        (images, _), (expected, _) = next(iter(loader)), next(iter(reference))
        assert torch.equal(images, expected), f"epoch {epoch}"


class Decoded(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Items are PIL's pixels of encoded images under one exif setting (HWC uint8 arrays)."""

    def __init__(self, items: list[bytes], exif: str):
        self.items, self.exif, self.targets = items, exif, [0] * len(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return pil(self.items[index], self.exif), 0


class Opened(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Items are ``Image.open(path)``, as torchvision's default loader gives them (orientation tag still there)."""

    def __init__(self, paths: list[Path], kind: str = "pil"):
        self.paths, self.kind, self.targets = paths, kind, [0] * len(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path = self.paths[index]
        return (Image.open(path) if self.kind == "pil" else path.read_bytes()), 0


@pytest.mark.parametrize("kind", ["pil", "bytes"])
@pytest.mark.parametrize("exif", ["ignore", "apply"])
def test_a_dataset_of_pil_images_or_bytes_follows_the_same_setting(folder: Path, exif: str, kind: str) -> None:
    expected = [center(pil(path.read_bytes(), exif), 40) for path in files(folder)]
    got = rows(Opened(files(folder), kind), exif, [CenterCrop(40)])
    for image, reference in zip(got, expected, strict=True):
        np.testing.assert_array_equal(image, reference)


def test_a_dataset_reader_given_directly_takes_the_loaders_setting(folder: Path) -> None:
    reader = DatasetReader(Opened(files(folder)))
    expected = [center(pil(path.read_bytes(), "apply"), 40) for path in files(folder)]
    for image, reference in zip(rows(reader, "apply", [CenterCrop(40)]), expected, strict=True):
        np.testing.assert_array_equal(image, reference)
    assert reader.exif == "ignore"  # the caller's reader is not changed


@pytest.mark.parametrize("exif", ["ignore", "apply"])
def test_shards_give_the_folders_pixels(folder: Path, tmp_path: Path, exif: str) -> None:
    ingest(folder, tmp_path, IngestOptions(shard_mb=0.01))
    assert [len(a) for a in rows(tmp_path, exif, [CenterCrop(40)])] == [40] * 8
    for a, b in zip(rows(tmp_path, exif, [CenterCrop(40)]), rows(folder, exif, [CenterCrop(40)]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("exif", ["ignore", "apply"])
def test_max_side_keeps_the_orientation_tag(folder: Path, tmp_path: Path, exif: str) -> None:
    # Re-encoded to a longer side of 32: 32x24 stored; the tag comes along, so 6 and 8 still display 24x32.
    ingest(folder, tmp_path, IngestOptions(shard_mb=0.01, max_side=32))
    reader = ShardReader(tmp_path)
    stored = [reader.read_image(i).tobytes() for i in range(len(reader))]
    for data, path in zip(stored, files(folder), strict=True):
        original = Image.open(path)
        image = Image.open(io.BytesIO(data))
        assert image.size == (32, 24)
        assert image.getexif().get(0x0112, 1) == original.getexif()[0x0112]  # 1 needs no tag
        assert pil(data, exif).shape[:2] == tuple(round(s / 2) for s in pil(path.read_bytes(), exif).shape[:2])
    for image, data in zip(rows(tmp_path, exif, [CenterCrop(20)]), stored, strict=True):
        np.testing.assert_array_equal(image, center(pil(data, exif), 20))


def test_a_format_converted_at_ingest_keeps_its_orientation(tmp_path: Path) -> None:
    # TIFF is re-encoded as PNG (the Loader takes JPEG and PNG); its orientation goes into the PNG's eXIf.
    (tmp_path / "src" / "a").mkdir(parents=True)
    pixels = np.asarray(Image.open(io.BytesIO(oriented(1))).convert("RGB"))
    Image.fromarray(pixels).save(tmp_path / "src" / "a" / "x.tif", "TIFF", tiffinfo={0x0112: 6})
    ingest(tmp_path / "src", tmp_path / "out", IngestOptions())
    data = ShardReader(tmp_path / "out").read_image(0).tobytes()
    assert Image.open(io.BytesIO(data)).format == "PNG"
    original = (tmp_path / "src" / "a" / "x.tif").read_bytes()
    for exif in ("ignore", "apply"):
        np.testing.assert_array_equal(pil(data, exif), pil(original, exif))
        (image,) = rows(tmp_path / "out", exif, [CenterCrop(40)])
        np.testing.assert_array_equal(image, center(pil(original, exif), 40))


def test_raw_shards_refuse_apply(folder: Path, tmp_path: Path) -> None:
    ingest(folder, tmp_path, IngestOptions(raw=(16, 16)))
    with pytest.raises(ValueError, match=r"exif='apply'.*--raw.*without --raw"):
        Loader(tmp_path, batch_size=4, transform=[CenterCrop(8)], exif="apply")
    assert Loader(tmp_path, batch_size=4, transform=[CenterCrop(8)]).options.decode.exif == "ignore"


def test_a_bad_exif_setting_is_refused(folder: Path) -> None:
    with pytest.raises(ValueError, match=r"exif must be 'ignore' or 'apply', got 'rotate'"):
        Loader(folder, batch_size=4, transform=[CenterCrop(8)], exif="rotate")  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.parametrize("exif", ["ignore", "apply"])
def test_the_mixed_decoder_follows_the_setting(folder: Path, exif: str) -> None:
    # nvJPEG rounds differently from libjpeg-turbo, so pixels agree closely; the orientation must agree exactly.
    expected = [center(pil(path.read_bytes(), exif), 40) for path in files(folder)]
    got = rows(folder, exif, [CenterCrop(40)], device="cuda")
    assert [image.shape for image in got] == [reference.shape for reference in expected]
    for image, reference in zip(got, expected, strict=True):
        assert np.abs(image.astype(int) - reference).mean() < 2.0
    spec = [RandomResizedCrop(32, scale=(0.2, 1.0))]  # the region-of-interest decode, windows on the right size
    for image, reference in zip(rows(folder, exif, spec, device="cuda"), rows(folder, exif, spec), strict=True):
        assert np.abs(image.astype(int) - reference).mean() < 3.0
