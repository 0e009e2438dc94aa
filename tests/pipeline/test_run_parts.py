"""An epoch run is built from picklable parts, never the Loader: in another process it gives the same batches.

This is what lets the graph run on other machines (Ray workers): the order, every random draw and the pixels come
from ``(config, sampler, reader, compiled spec)`` and ``(seed, epoch, sample)``, not from where the work runs.
"""

from __future__ import annotations

import multiprocessing
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallfree import Loader
from stallfree.transforms import RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(16, scale=(0.3, 1.0)), RandomHorizontalFlip()]


def _batches_elsewhere(parts: bytes, epoch: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """In a fresh process: the run's first ``count`` batches, from the pickled parts and a graph built there."""
    from stallfree.pipeline.epoch import EpochRun
    from stallfree.pipeline.graph import Graph

    run_parts = pickle.loads(parts)
    config = run_parts.config
    graph = Graph(run_parts.compiled, batch_size=config.batcher.largest, num_threads=1, device_id=None,
                  encoded=config.encoded, seed=config.seed, exif=config.exif)
    run = EpochRun(run_parts, graph, epoch, 0, 0, 0, [])
    out = []
    for batch in run:
        assert batch.fields["image"] is not None
        out.append((batch.fields["image"].numpy().copy(), np.asarray(batch.rows)))
        if len(out) == count:
            break
    run.stop()
    run.join(10.0)
    return out


@pytest.fixture(scope="module")
def shard_folder(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stallfree.ingest.runner import ingest
    from stallfree.ingest.writer import IngestOptions

    out = tmp_path_factory.mktemp("parts-shards")
    ingest(image_folder, out, IngestOptions(shard_mb=0.01))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("source", ["folder", "shards"])
def test_a_run_built_in_another_process_from_the_parts_gives_the_loaders_batches(
    source: str, image_folder: Path, shard_folder: Path
) -> None:
    data = image_folder if source == "folder" else shard_folder
    loader = Loader(data, batch_size=4, transform=SPEC, seed=7, dtype="uint8", num_threads=1)
    if source == "shards":
        next(iter(loader))  # the reader has shards open, a lock and a verified cache: it still pickles
    loader.set_epoch(2)
    local = [(images.numpy(), labels.numpy()) for images, labels in loader][:3]
    parts: Any = loader._epochs.parts(loader._epochs.shard())
    assert not any(value is loader for value in vars(parts).values())
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        remote = pool.apply(_batches_elsewhere, (pickle.dumps(parts), 2, 3))
    assert len(remote) == 3
    for (images, labels), (their_images, rows) in zip(local, remote, strict=True):
        assert np.array_equal(images, their_images)
        assert np.array_equal(labels, loader.labels[rows])


def test_a_shard_reader_pickles_as_where_it_was_opened(shard_folder: Path) -> None:
    from stallfree.pipeline.shards import ShardReader

    reader = ShardReader(shard_folder, verify="none")
    reader.read_image(0)  # maps a shard
    copy = pickle.loads(pickle.dumps(reader))
    assert copy is not reader and copy.folder == reader.folder
    rows = range(len(reader))
    assert [bytes(copy.read_image(i)) for i in rows] == [bytes(reader.read_image(i)) for i in rows]
    assert copy.fingerprint() == reader.fingerprint()
