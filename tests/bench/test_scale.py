"""``stallfree bench scale``'s generated index is a valid ingested folder, read row by row across batch edges."""

import argparse
import io
from pathlib import Path

import numpy as np
import pytest

from stallfree.bench.scale import add_arguments, generate_index, run
from stallfree.pipeline.sampler import Sampler
from stallfree.pipeline.shards import ShardReader


def test_the_index_opens_as_shards_with_every_row_where_it_belongs(tmp_path: Path) -> None:
    generate_index(tmp_path, 5000, 2100, classes=7)  # 3 shards; each of 1024-row record batches but the last
    reader = ShardReader(tmp_path, verify="open")
    assert len(reader) == 5000 and len(reader.manifest["shards"]) == 3
    np.testing.assert_array_equal(reader.labels(), np.arange(5000) % 7)
    edges = [0, 1023, 1024, 2047, 2099, 2100, 2101, 4199, 4200, 4999]
    keys = reader.column("key", np.asarray(edges))
    assert keys == [f"{row % 7}/{row}.JPEG" for row in edges]
    assert all(reader.read_image(row).tobytes() == bytes(range(16)) for row in edges)
    order = Sampler(len(reader), rank=1, world_size=3, seed=2).virtual_order(0)
    assert [reader.describe(int(r)).endswith(f"({r % 7}/{r}.JPEG)") for r in order[:50]] == [True] * 50


def test_listing_measures_the_whole_folder_and_one_part() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    result = run(parser.parse_args(["--listing", "300", "--parts", "3", "--repeats", "1"]), io.StringIO())
    assert [(row["part"], row["listed"]) for row in result["rows"]] == [("0/1", 300), ("0/3", 99)]


@pytest.mark.slow
def test_the_block_shuffles_first_order_is_measured_for_one_rank(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--samples", "6000", "--rows-per-shard", "1000", "--world-size", "4", "--repeats", "1",
                              "--reads", "100", "--shuffle", "block", "--block-shards", "2", "--keep",
                              str(tmp_path / "index")])
    out = io.StringIO()
    result = run(args, out)
    assert result["shuffle"] == "block" and result["median"]["rank_samples"] == 1500
    assert result["median"]["order_mb"] == 1500 * 8 / 1e6
    assert "first order" in out.getvalue() and "2 shards a block" in out.getvalue()


def test_bad_block_shards_are_refused() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="--block-shards must be >= 1, got 0"):
        run(parser.parse_args(["--block-shards", "0"]), io.StringIO())
