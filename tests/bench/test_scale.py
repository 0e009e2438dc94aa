"""``stallfree bench scale``'s generated index is a valid ingested folder, read row by row across batch edges."""

from pathlib import Path

import numpy as np

from stallfree.bench.scale import generate_index
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
    assert all(reader.read(row).tobytes() == bytes(range(16)) for row in edges)
    order = Sampler(len(reader), rank=1, world_size=3, seed=2).virtual_order(0)
    assert [reader.describe(int(r)).endswith(f"({r % 7}/{r}.JPEG)") for r in order[:50]] == [True] * 50


def test_listing_measures_the_whole_folder_and_one_part() -> None:
    import argparse
    import io

    from stallfree.bench.scale import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    result = run(parser.parse_args(["--listing", "300", "--parts", "3", "--repeats", "1"]), io.StringIO())
    assert [(row["part"], row["listed"]) for row in result["rows"]] == [("0/1", 300), ("0/3", 99)]
