"""A shard whose footer schema differs from the manifest's is refused when it is opened, by name (issue 10, 13)."""

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from stallfree.ingest.runner import ingest
from stallfree.ingest.verify import verify
from stallfree.ingest.writer import IngestOptions
from stallfree.pipeline.shards import ShardError, ShardReader


@pytest.fixture(scope="module", params=["encoded", "raw"])
def shards(request: pytest.FixtureRequest, image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"shards-{request.param}")
    raw = request.param == "raw"
    ingest(image_folder, out, IngestOptions(shard_mb=0.001 if raw else 0.01, raw=(8, 8) if raw else None))
    assert len(list(out.glob("shard-*.arrow"))) > 1
    return out


def _rename_in_footer(shard: Path, old: str, new: str) -> None:
    """Rename field ``old`` in the Arrow file footer's schema (the one a file reader uses), in place."""
    data = bytearray(shard.read_bytes())
    assert data.endswith(b"ARROW1") and len(old) == len(new)
    (length,) = struct.unpack("<i", data[-10:-6])
    start = len(data) - 10 - length
    # A flatbuffer string: its uint32 length, its bytes, a NUL.
    needle = struct.pack("<I", len(old)) + old.encode() + b"\0"
    where = data.index(needle, start)
    data[where + 4 : where + 4 + len(old)] = new.encode()
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize("verify_mode", ["first-use", "open"])
@pytest.mark.parametrize("field", ["key", "image", "label"])
def test_a_damaged_footer_schema_names_the_shard_and_the_column(shards, tmp_path, verify_mode, field):
    # Before: `KeyError: 'Field "key" does not exist in schema'`, naming neither the shard nor the damage.
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    shard = sorted(copy.glob("shard-*.arrow"))[1]
    _rename_in_footer(shard, field, field[:-1] + "Q")
    with pytest.raises(ShardError, match=rf"{shard.name} lacks the column '{field}' \(\w+\) that the manifest lists; "
                                         rf"its columns are \[.*'{field[:-1]}Q'.*\] \(a damaged footer\?\)"):
        reader = ShardReader(copy, verify=verify_mode)
        for column in reader.columns:  # the KeyError came from here, or from opening (the image column)
            reader.column(column, np.arange(len(reader)))
    problems = verify(copy)
    assert any(p.startswith(f"{shard.name}: lacks the column '{field}'") for p in problems), problems
