"""The trainer's Loader checks shards as ``TrainConfig.verify`` says (issue 16: the lazy shard checksum
"``Loader(...)``/``stallfree train`` cannot turn it down")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions
from stallfree.pipeline.shards import ShardError
from stallfree.stage_runtime.config.train_config import TrainConfig
from stallfree.stage_runtime.train.feed import make_feed


@pytest.fixture
def altered(indexed_list: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Shards of the 37 indexed PNGs, the last one altered inside its image bytes: only its checksum tells."""
    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path / "cache"))
    ingest(indexed_list, tmp_path / "shards", IngestOptions(shard_mb=0.01))
    shard = sorted((tmp_path / "shards").glob("shard-*.arrow"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x01
    shard.write_bytes(bytes(data))
    return tmp_path / "shards", shard


def _feed(data: Path, verify: Any) -> Any:
    return make_feed(str(data), train=True, batch_size=4, image_size=8, num_classes=37, seed=0, replica=0,
                     replicas=1, samples=0, device="cpu", workers=1, verify=verify)


def test_open_refuses_an_altered_shard_before_the_first_batch(altered: tuple[Path, Path]) -> None:
    data, shard = altered
    with pytest.raises(ShardError, match=rf"{shard.name}: SHA-256 differs from the manifest's"):
        _feed(data, "open")


def test_first_use_raises_on_the_shards_first_read_and_none_never_hashes(altered: tuple[Path, Path]) -> None:
    data, shard = altered
    unchecked = _feed(data, "none").reader
    assert len([unchecked.read(i) for i in range(len(unchecked))]) == 37
    checked = _feed(data, "first-use").reader
    with pytest.raises(ShardError, match=rf"{shard.name}: SHA-256 differs"):
        [checked.read(i) for i in range(len(checked))]


def test_an_unknown_mode_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"verify must be one of \('first-use', 'open', 'none'\), got 'never'"):
        TrainConfig.from_flags(verify="never")  # type: ignore[arg-type]
