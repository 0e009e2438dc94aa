"""One image check for ingest and the Loader: what ingest accepts, the Loader reads back; what one refuses, both do.

Regression: ingest accepted a PNG whose IEND chunk sat anywhere in its last 64 bytes while the Loader demanded
it at the very end, so a PNG ingested fine was refused when read back from the shards.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stallfree import Loader
from stallfree.ingest.images import BadImage, read_header
from stallfree.ingest.runner import ingest
from stallfree.ingest.validate import Rejected, check_image
from stallfree.transforms import CenterCrop, Normalize


def _png(trailing: bytes = b"") -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (12, 14, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue() + trailing


def _jpeg_with_thumbnail_truncated() -> bytes:
    image = Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 48, 3), dtype=np.uint8))
    thumb = io.BytesIO()
    image.resize((8, 8)).save(thumb, "JPEG")
    exif = Image.Exif()
    exif[0x0112] = 1
    out = io.BytesIO()
    # An APP2 segment carrying a complete JPEG (markers and all) before the main image, as thumbnails do.
    image.save(out, "JPEG", exif=exif.tobytes())
    data = out.getvalue()
    app2 = b"\xff\xe2" + (len(thumb.getvalue()) + 2).to_bytes(2, "big") + thumb.getvalue()
    whole = data[:2] + app2 + data[2:]
    return whole[: len(whole) - 40]  # cut inside the main image's scan data


CASES = {
    "png-at-end": (_png(), True),
    "png-40-trailing-bytes": (_png(b"\x00" * 40), True),
    "png-100-trailing-bytes": (_png(b"\x00" * 100), False),
    "png-cut": (_png()[:-20], False),
    "jpeg-cut-after-a-complete-thumbnail": (_jpeg_with_thumbnail_truncated(), False),
}


@pytest.mark.parametrize("case", CASES)
def test_ingest_and_the_loader_agree(case: str) -> None:
    data, good = CASES[case]
    if good:
        assert check_image(data).height == read_header(data).height
        return
    with pytest.raises(BadImage) as loader_says:
        read_header(data)
    with pytest.raises(Rejected) as ingest_says:
        check_image(data)
    assert ingest_says.value.reason == loader_says.value.reason


def test_an_ingested_png_with_trailing_bytes_is_read_back(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(4):
        (src / f"{i}.png").write_bytes(_png(b"\x00" * (10 * i)))
    summary = ingest(tmp_path / "src", tmp_path / "out")
    assert summary["rejected"] == 0, json.dumps(summary)
    loader = Loader(tmp_path / "out", 4, transform=[CenterCrop(8), Normalize()], num_threads=1)
    (images, labels), = list(loader)
    assert images.shape == (4, 3, 8, 8) and loader.skipped == []
