"""The Loader over ingested shards: the folder source's pixels, order, resume and errors; raw pixels; columns."""

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from stallfree import BadSampleError, Loader
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions
from stallfree.pipeline.readers import FolderReader, open_source
from stallfree.pipeline.shards import ShardError, ShardReader
from stallfree.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()]


@pytest.fixture(scope="module")
def shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    ingest(image_folder, out, IngestOptions(shard_mb=0.01))
    return out


@pytest.fixture(scope="module")
def indexed_shards(indexed_list: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 37 PNGs whose label is their row index, with an extra numeric and string column."""
    table = indexed_list.read_text().splitlines()
    lines = [table[0] + ",weight,name"] + [f"{line},{i / 4},n{i}" for i, line in enumerate(table[1:])]
    listing = indexed_list.with_name("extra.csv")
    listing.write_text("\n".join(lines) + "\n")
    out = tmp_path_factory.mktemp("indexed-shards")
    ingest(listing, out, IngestOptions(shard_mb=0.005))
    return out


def make(source, **kwargs) -> Loader:
    kwargs.setdefault("batch_size", 5)
    kwargs.setdefault("num_threads", 1)
    kwargs.setdefault("transform", SPEC)
    return Loader(source, seed=3, **kwargs)


def test_reader_gives_the_original_bytes_zero_copy(image_folder: Path, shards: Path) -> None:
    reader, folder = open_source(shards), FolderReader(image_folder)
    assert isinstance(reader, ShardReader) and len(reader.manifest["shards"]) > 1
    assert reader.classes == folder.classes and np.array_equal(reader.labels(), folder.labels())
    for i in range(len(folder)):
        data = reader.read_image(i)
        assert data.tobytes() == folder.read_image(i).tobytes() and not data.flags.owndata
    assert reader.describe(3).endswith(f"row 3 ({folder.paths[3].relative_to(image_folder)})")


def test_same_batches_as_the_folder(image_folder: Path, shards: Path) -> None:
    for (x, y), (x2, y2) in zip(make(image_folder), make(shards), strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


@pytest.mark.parametrize("world_size", [1, 3])
def test_each_sample_exactly_once_across_ranks(indexed_shards: Path, world_size: int) -> None:
    seen: Counter[int] = Counter()
    for rank in range(world_size):
        for _, labels in make(indexed_shards, rank=rank, world_size=world_size):
            seen.update(labels.tolist())
    assert set(seen) == set(range(37)) and sum(seen.values()) == 37 + (-37 % world_size)


def test_resume_mid_epoch_is_bit_identical(indexed_shards: Path) -> None:
    full = list(make(indexed_shards, echo=2))
    loader = make(indexed_shards, echo=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    resumed = make(indexed_shards, echo=2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 3
    for (x, y), (x2, y2) in zip(full[3:], rest, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_extra_columns_come_beside_images_and_labels(indexed_shards: Path) -> None:
    for images, labels, extras in make(indexed_shards, columns=["weight", "name"]):
        assert images.shape[0] == len(labels) and torch.equal(extras["weight"], labels.double() / 4)
        assert extras["name"] == [f"n{i}" for i in labels.tolist()]
    with pytest.raises(ValueError, match=r"columns=\['nope'\] but the source has columns \['key', 'label'"):
        make(indexed_shards, columns=["nope"])


def test_raw_shards_skip_decoding(image_folder: Path, tmp_path: Path) -> None:
    ingest(image_folder, tmp_path, IngestOptions(raw=(16, 16)))
    loader = make(tmp_path, transform=[CenterCrop(16)], dtype="uint8", layout="NHWC", shuffle=False)
    assert not loader.reader.encoded and loader.reader.read_image(0).shape == (16, 16, 3)
    images = torch.cat([x for x, _ in loader])
    assert np.array_equal(images.numpy(), np.stack([loader.reader.read_image(i) for i in range(len(loader.reader))]))


def test_a_flipped_byte_names_the_shard(shards: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    shard = sorted(copy.glob("shard-*.arrow"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01  # inside the image bytes: only the checksum sees it
    shard.write_bytes(bytes(data))
    with pytest.raises(BadSampleError, match=rf"{shard.name} row \d+ .*SHA-256 differs from the manifest's"):
        list(make(copy, transform=[CenterCrop(12)], shuffle=False))
    loader = make(copy, transform=[CenterCrop(12)], shuffle=False, on_error="skip")
    delivered = sum(len(labels) for _, labels in loader)
    bad = {s["source"].split(" row ")[0] for s in loader.skipped}
    assert bad == {str(shard)} and len({s["index"] for s in loader.skipped}) == len(loader.skipped)
    assert delivered == len(loader.reader), "skipped rows are replaced by the next ones, wrapping round"


def test_a_truncated_shard_is_refused_on_its_first_read(shards: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    shard = sorted(copy.glob("shard-*.arrow"))[0]
    shard.write_bytes(shard.read_bytes()[:-200])
    truncated = rf"{shard.name} has \d+ bytes but the manifest says \d+ \(truncated\?\)"
    with pytest.raises(BadSampleError, match=rf"{shard.name} row 0 .*: unreadable: .*{truncated}"):
        list(make(copy, shuffle=False))  # constructed (no shard opened), then refused on the shard's first row
    with pytest.raises(ShardError, match=truncated):
        ShardReader(copy, verify="open")
    (copy / "manifest.json").write_text((copy / "manifest.json").read_text().replace(
        str(shard.stat().st_size + 200), str(shard.stat().st_size)))
    with pytest.raises(ShardError, match=rf"{shard.name} is not a valid Arrow shard"):
        ShardReader(copy).read(0)


@pytest.mark.gpu
def test_shards_on_the_gpu(image_folder: Path, shards: Path, tmp_path: Path) -> None:
    """nvJPEG decodes the memory-mapped bytes; raw shards reach the GPU pixel for pixel."""
    on_gpu = list(make(shards, device="cuda", shuffle=False, transform=[CenterCrop(12)], dtype="uint8"))
    on_cpu = list(make(image_folder, shuffle=False, transform=[CenterCrop(12)], dtype="uint8"))
    for (x, y), (x2, y2) in zip(on_gpu, on_cpu, strict=True):
        assert x.is_cuda and x.shape == x2.shape and torch.equal(y.cpu(), y2)
        assert (x.cpu().int() - x2.int()).abs().float().mean() < 3  # nvJPEG and libjpeg-turbo round differently
    ingest(image_folder, tmp_path, IngestOptions(raw=(16, 16)))
    loader = make(tmp_path, device="cuda", transform=[CenterCrop(16)], dtype="uint8", layout="NHWC", shuffle=False)
    images = torch.cat([x.cpu() for x, _ in loader])
    assert np.array_equal(images.numpy(), np.stack([loader.reader.read_image(i) for i in range(len(loader.reader))]))
