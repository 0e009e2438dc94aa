"""Fixtures of the remote tests: an ingested dataset served by real servers on 127.0.0.1 (HTTP, S3) and a proxy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stallfree.bench.servers import FaultProxy, RangeServer, s3_server
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions


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


@pytest.fixture
def http_proxy(http_server: RangeServer) -> Iterator[FaultProxy]:
    """A fresh fault proxy in front of the HTTP server (faults are queued per test)."""
    with FaultProxy(http_server.url) as proxy:
        yield proxy


@pytest.fixture
def s3_proxy(s3_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint) as proxy:
        yield proxy
