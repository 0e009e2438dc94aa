"""Small generated sources for the ingest tests, and a reader of what ingest wrote (pyarrow only)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from PIL import Image


def _encode(seed: int, size: tuple[int, int] = (20, 28), fmt: str = "JPEG") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def _shard_rows(out: Path) -> list[dict]:
    """Every row of every shard in ``out``, in the manifest's order (the file names' where there is none yet)."""
    manifest = out / "manifest.json"
    shards = ([out / s["file"] for s in json.loads(manifest.read_text())["shards"]] if manifest.is_file()
              else sorted(out.glob("shard-*.arrow")))
    rows = []
    for shard in shards:
        with pa.memory_map(str(shard)) as source:
            rows.extend(ipc.open_file(source).read_all().to_pylist())
    return rows


@pytest.fixture(scope="session")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of 3 classes x 6 JPEGs of varied sizes."""
    from stallfree.ingest.synthetic import make_image_folder

    return make_image_folder(tmp_path_factory.mktemp("src") / "folder", num_classes=3, per_class=6,
                             size=(24, 32), vary_size=True)


@pytest.fixture(scope="session")
def encode():
    """``encode(seed, size=(h, w), fmt="JPEG") -> bytes``: a random-noise image."""
    return _encode


@pytest.fixture(scope="session")
def shard_rows():
    """``shard_rows(out) -> list[dict]``: every row of every shard, in shard order."""
    return _shard_rows
