"""Fixtures of the pipeline tests: a dataset whose labels are its indices; for the remote tests an ingested dataset
served by real servers on 127.0.0.1 (HTTP, S3) and a proxy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from stallfree import DatasetReader
from stallfree.bench.servers import FaultProxy, RangeServer
from stallfree.bench.stores import gcs_server, s3_server
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions


class _Indexed:
    """n tiny decoded images, label = index, so a batch's labels say which samples it holds."""

    def __init__(self, n: int):
        self.targets = list(range(n))

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((4, 4, 3), i % 256, np.uint8), i


@pytest.fixture
def graph_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaders built in the test keep their graph in the test's process (``LocalGraph``), for the tests of its own
    mechanics (runs started ahead, its threads, a graph broken from outside), which the graph process runs unchanged
    (pipeline/process_graph.py)."""
    monkeypatch.setenv("STALLFREE_GRAPH_PROCESS", "0")


@pytest.fixture(scope="session")
def indexed_reader() -> Callable[[int], DatasetReader]:
    """``indexed_reader(n)``: a reader of n tiny 4x4 images whose label is their index (session-wide, so that
    hypothesis tests may use it)."""
    return lambda n: DatasetReader(_Indexed(n))


@pytest.fixture(scope="session")
def remote_data(indexed_list: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 37 PNGs whose label is their row index, ingested into several small shards."""
    out = tmp_path_factory.mktemp("remote-data")
    ingest(indexed_list, out, IngestOptions(shard_mb=0.006))
    return out


@pytest.fixture(scope="session")
def http_server(remote_data: Path) -> Iterator[RangeServer]:
    with RangeServer(remote_data) as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint(remote_data: Path) -> Iterator[str]:
    """moto's S3 server with the dataset at s3://data/ds/."""
    with s3_server(remote_data, bucket="data", prefix="ds") as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def gcs_endpoint(remote_data: Path) -> Iterator[str]:
    """A Cloud Storage server (gcp-storage-emulator) with the dataset at gs://data/ds/."""
    with gcs_server(remote_data, bucket="data", prefix="ds") as endpoint:
        yield endpoint


@pytest.fixture
def http_proxy(http_server: RangeServer) -> Iterator[FaultProxy]:
    """A fresh fault proxy in front of the HTTP server (faults are queued per test)."""
    with FaultProxy(http_server.url) as proxy:
        yield proxy


@pytest.fixture
def s3_proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint) as proxy:
        yield proxy
