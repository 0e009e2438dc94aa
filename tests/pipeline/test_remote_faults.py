"""Faults of a remote store, injected by a real proxy on 127.0.0.1: retried, re-downloaded, skipped or raised."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from stallfree import BadSampleError, Loader, RemoteStoreError
from stallfree.bench.servers import FaultProxy
from stallfree.bench.stores import s3_options
from stallfree.transforms import Normalize, RandomResizedCrop

SPEC = [RandomResizedCrop(12), Normalize()]
FAST = {"retries": 4, "remote_timeout": 2.0}  # bounded: a test cannot wait long on a fault


def _labels(loader: Loader) -> list[int]:
    return sorted(torch.cat([b[1] for b in loader]).tolist())


def _make(url: str, cache: Path, **extra: Any) -> Loader:
    return Loader(url, 4, transform=SPEC, cache_dir=cache, **{**FAST, **extra})


@pytest.mark.parametrize("fault", ["503", "drop", "truncate"])
def test_transient_faults_are_retried_over_http(fault: str, http_proxy: FaultProxy, remote_data: Path,
                                                tmp_path: Path) -> None:
    local = [tuple(b) for b in Loader(remote_data, 4, transform=SPEC)]
    http_proxy.inject(fault, count=3, match=".arrow")
    remote = [tuple(b) for b in _make(http_proxy.url, tmp_path)]
    assert len(remote) == len(local) and all(torch.equal(a[0], b[0]) for a, b in zip(remote, local, strict=True))
    assert [m.split()[0] for m in http_proxy.met] == [fault] * 3


def test_a_5xx_from_s3_is_retried(s3_proxy: FaultProxy, tmp_path: Path) -> None:
    s3_proxy.inject("503", count=2, match=".arrow")
    loader = _make("s3://data/ds/", tmp_path, storage_options=s3_options(s3_proxy.url))
    assert _labels(loader) == list(range(37))
    assert len(s3_proxy.met) == 2


def test_retries_are_bounded_and_the_error_names_the_url(http_proxy: FaultProxy, tmp_path: Path) -> None:
    http_proxy.inject("503", count=1000, match=".arrow")
    loader = _make(http_proxy.url, tmp_path, retries=3, downloads=1)
    with pytest.raises(RemoteStoreError, match=r"http://127\.0\.0\.1:\d+/shard-\d+\.arrow: 3 tries failed \(the "
                                               r"last: .*503"):
        _labels(loader)


def test_a_corrupt_transfer_is_downloaded_once_more(http_proxy: FaultProxy, tmp_path: Path) -> None:
    http_proxy.inject("corrupt", count=1, match=".arrow")
    assert _labels(_make(http_proxy.url, tmp_path)) == list(range(37))
    assert len(http_proxy.met) == 1


def test_a_shard_corrupt_twice_raises_naming_shard_and_url(http_proxy: FaultProxy, tmp_path: Path) -> None:
    http_proxy.inject("corrupt", count=2, match="shard-00001.arrow")
    with pytest.raises(BadSampleError, match=r"shard shard-00001\.arrow \(http://127\.0\.0\.1:\d+/shard-00001\.arrow"
                                             r"\): http://.*SHA-256 .* differs from the manifest's"):
        _labels(_make(http_proxy.url, tmp_path, shuffle=False))


def test_a_shard_corrupt_twice_is_skipped_with_on_error_skip(http_proxy: FaultProxy, remote_data: Path,
                                                            tmp_path: Path) -> None:
    http_proxy.inject("corrupt", count=2, match="shard-00001.arrow")
    loader = _make(http_proxy.url, tmp_path, on_error="skip")
    batches = list(loader)
    assert len(batches) == len(loader)
    skipped = {s["index"] for s in loader.skipped}
    assert skipped and all("shard-00001.arrow" in s["source"] and "SHA-256" in s["reason"] for s in loader.skipped)
    seen = set(torch.cat([b[1] for b in batches]).tolist())
    assert seen.isdisjoint(skipped) and seen | skipped == set(range(37))
    assert len(http_proxy.met) == 2  # the bad shard was not fetched again for each of its rows


def test_a_stalled_store_raises_instead_of_hanging(http_proxy: FaultProxy, tmp_path: Path) -> None:
    http_proxy.inject("stall", count=1000, match=".arrow", seconds=3.0)
    loader = _make(http_proxy.url, tmp_path, retries=2, remote_timeout=0.5, downloads=1)
    start = time.monotonic()
    with pytest.raises(RemoteStoreError, match=r"2 tries failed \(the last: .*Timeout.*remote_timeout"):
        _labels(loader)
    assert time.monotonic() - start < 30  # bounded by retries x timeout, not by the store


def test_latency_and_a_bandwidth_cap_change_nothing_but_time(http_proxy: FaultProxy, tmp_path: Path) -> None:
    http_proxy.faults.latency, http_proxy.faults.bandwidth = 0.05, 200_000.0
    assert _labels(_make(http_proxy.url, tmp_path)) == list(range(37))
