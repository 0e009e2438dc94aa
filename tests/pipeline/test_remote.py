"""The Loader over a dataset at a URL: real HTTP (with Range) and S3 (moto) servers on 127.0.0.1, a real cache."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stallfree import Loader
from stallfree.bench.servers import FaultProxy, RangeServer
from stallfree.bench.stores import gcs_options, s3_options
from stallfree.ingest.fetch import Progress
from stallfree.ingest.manifest import read_manifest
from stallfree.ingest.remote import Retry
from stallfree.pipeline.shard_cache import ShardCache
from stallfree.pipeline.shards import ShardError
from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()]


def _batches(loader: Loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = [tuple(b) for b in loader]
    return out  # type: ignore[return-value]


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q, strict=True))
                                    for p, q in zip(a, b, strict=True))


def _url(kind: str, remote_data: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """The dataset's URL of ``kind`` and the Loader's keywords for it (each server starts when a test first asks)."""
    if kind == "http":
        return request.getfixturevalue("http_server").url + "/", {}
    if kind == "s3":
        return "s3://data/ds/", {"storage_options": s3_options(request.getfixturevalue("s3_endpoint"))}
    if kind == "gs":
        return "gs://data/ds/", {"storage_options": gcs_options(request.getfixturevalue("gcs_endpoint"))}
    return remote_data.resolve().as_uri(), {}


@pytest.mark.parametrize("kind", ["http", "s3", "gs", "file"])
@pytest.mark.parametrize("shuffle", [True, "block"])
def test_a_url_gives_the_batches_of_the_local_folder(kind: str, shuffle: Any, remote_data: Path,
                                                     request: pytest.FixtureRequest, tmp_path: Path) -> None:
    local = _batches(Loader(remote_data, 4, transform=SPEC, seed=3, shuffle=shuffle, block_shards=2))
    url, extra = _url(kind, remote_data, request)
    loader = Loader(url, 4, transform=SPEC, seed=3, shuffle=shuffle, block_shards=2, cache_dir=tmp_path, **extra)
    assert _same(_batches(loader), local)
    manifest = read_manifest(remote_data)
    assert sorted(p.name for p in tmp_path.glob("*.arrow")) == sorted(f"{s['sha256']}.arrow"
                                                                       for s in manifest["shards"])
    assert loader.reader.cache.fetched == len(manifest["shards"])  # each shard fetched once, none again
    assert loader.fingerprint() == Loader(remote_data, 4, transform=SPEC, seed=3, shuffle=shuffle,
                                          block_shards=2).fingerprint()  # a state moves between the two
    loader.close()


def test_gs_is_read_by_gcsfs_without_its_grpc_layout_call() -> None:
    """Regression (issue 45, item 7): the three gs:// cases took 125, 125 and 226 s of the suite when another test
    (Lightning's Trainer, tests/pipeline/test_lightning.py) imported gcsfs before gcs_server had set
    GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false: gcsfs then asks the gRPC control API, which the emulator does not
    serve, for each bucket's layout and waits out a minute's timeout. tests/conftest.py sets it before any test."""
    import gcsfs

    assert gcsfs.GCSFileSystem is gcsfs.core.GCSFileSystem, "gcsfs was imported with its gRPC layout call on"


def test_a_second_loader_reads_the_cache_and_fetches_nothing(remote_data: Path, http_server: RangeServer,
                                                             tmp_path: Path) -> None:
    first = Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path)
    _batches(first)
    fetched, before = first.reader.cache.fetched, http_server.requests
    again = Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path)  # one process: the same cache
    labels = torch.cat([b[1] for b in _batches(again)])
    assert sorted(labels.tolist()) == list(range(37))
    assert again.reader.cache.fetched == fetched and http_server.requests == before + 2  # manifest, labels.npy


def test_a_cache_dir_held_by_another_process_is_refused(http_server: RangeServer, tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from stallfree.ingest.remote import Retry; "
                               "from stallfree.pipeline.shard_cache import ShardCache; "
                               "c = ShardCache(Path(sys.argv[1]), None, 1, Retry()); print('held', flush=True); "
                               "time.sleep(60)", str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=f"cache_dir {tmp_path} is in use by another process; give each process"):
            Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path)
    finally:
        holder.kill()
        holder.wait()


def _cached_bytes(cache: Path) -> int:
    """Bytes of the shards in ``cache`` now; a file evicted between the listing and its stat is not there."""
    total = 0
    for path in cache.glob("*.arrow"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # the next epoch's pass, started ahead, evicts while the test counts
            continue
    return total


def test_a_cache_smaller_than_the_data_stays_bounded_and_delivers_every_sample_once(
        remote_data: Path, http_server: RangeServer, tmp_path: Path) -> None:
    shards = read_manifest(remote_data)["shards"]
    largest = max(s["bytes"] for s in shards)
    limit = 2 * largest
    for shuffle in (True, "block"):
        cache = tmp_path / str(shuffle)
        loader = Loader(http_server.url, 5, transform=SPEC, shuffle=shuffle, block_shards=1, cache_dir=cache,
                        cache_limit=limit, io_threads=1)
        started = _count_fetches_per_pass(loader)
        for epoch in range(2):
            labels = torch.cat([b[1] for b in _batches(loader)])
            assert sorted(labels.tolist()) == list(range(37)), f"{shuffle} epoch {epoch}"
            assert _cached_bytes(cache) <= limit
        if shuffle == "block":  # one shard at a time: each shard fetched once per epoch, never twice
            # counted when the third epoch's pass starts (ahead, once the second's last batch is queued): what it
            # fetches then is its own
            cache_now = loader.reader.cache
            assert (started[2] if len(started) > 2 else cache_now.fetched + cache_now.pending()) <= 2 * len(shards)
        loader.close()


def _count_fetches_per_pass(loader: Loader) -> list[int]:
    """The shards downloaded or downloading when each pass started, filled in as passes start."""
    started: list[int] = []
    follow = loader.reader.follow

    def counted(rows: Any) -> None:
        started.append(loader.reader.cache.fetched + loader.reader.cache.pending())
        follow(rows)

    loader.reader.follow = counted
    return started


def _local_fetch(source: Path) -> Any:
    def fetch(sha256: str, dest: Path, progress: Progress) -> None:
        dest.write_bytes((source / f"{sha256}.bin").read_bytes())
    return fetch


def test_a_shard_being_read_is_never_evicted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    for name in "abc":
        (store / f"{name}.bin").write_bytes(bytes(100))
    cache, fetch = ShardCache(tmp_path / "cache", 150, 2, Retry()), _local_fetch(store)
    a = cache.acquire("a", 100, fetch, "a")
    b = cache.acquire("b", 100, fetch, "b")  # over the limit: both are being read, so neither may go
    assert a.is_file() and b.is_file()
    cache.release("b")
    assert a.is_file() and not b.is_file()  # b was the one not pinned
    cache.release("a")
    c = cache.acquire("c", 100, fetch, "c")
    assert c.is_file() and not a.is_file() and cache.used <= 150
    assert cache.used == sum(f.stat().st_size for f in (tmp_path / "cache").glob("*.arrow"))  # its kept count
    assert cache.pin("c") and not cache.pin("a")  # a reader holding c mapped pins it; a is gone
    cache.release("c")
    cache.release("c")
    (tmp_path / "found").mkdir()
    (tmp_path / "found" / "d.arrow").write_bytes(bytes(60))  # an earlier run's file: hashed before first use
    found = ShardCache(tmp_path / "found", 150, 2, Retry())
    assert found.used == 60 and not found.pin("d")


def test_loader_keywords_of_a_remote_source_are_checked(remote_data: Path, http_server: RangeServer,
                                                        image_folder: Path, tmp_path: Path) -> None:
    largest = max(s["bytes"] for s in read_manifest(remote_data)["shards"])
    with pytest.raises(ValueError, match=rf"cache_limit=10 is smaller than the largest shard .*\({largest} bytes\)"):
        Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path, cache_limit=10)
    with pytest.raises(ValueError, match="cache_limit= apply to a dataset at a URL"):
        Loader(remote_data, 4, transform=SPEC, cache_limit=1 << 20)
    with pytest.raises(ValueError, match="downloads must be an int >= 1"):
        Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path, downloads=0)
    with pytest.raises(ValueError, match="remote_timeout must be a positive number"):
        Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path, remote_timeout=0)
    with pytest.raises(ValueError, match="retries must be an int >= 1"):
        Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path, retries=0)
    with pytest.raises(ValueError, match="shuffle must be True .*'block'"):
        Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path, shuffle="blocks")
    with pytest.raises(ValueError, match="shuffle='block' shuffles the shards of ingested data, but the source is a "
                                         "FolderReader"):
        Loader(image_folder, 4, transform=SPEC, shuffle="block")


def test_a_missing_manifest_names_the_url_without_credentials(http_server: RangeServer, tmp_path: Path) -> None:
    url = http_server.url.replace("http://", "http://user:hunter2@") + "/nothing-here/"
    with pytest.raises(FileNotFoundError, match=r"http://127\.0\.0\.1:\d+/nothing-here/manifest\.json does not "
                                                "exist") as raised:
        Loader(url, 4, transform=SPEC, cache_dir=tmp_path)
    assert "hunter2" not in str(raised.value)


def test_a_missing_client_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"reading s3:// data needs s3fs: pip install 'stallfree\[s3\]'"):
        Loader("s3://bucket/ds/", 4, transform=SPEC, cache_dir=tmp_path)


def test_shards_of_another_dataset_in_a_reused_cache_are_checked(remote_data: Path, http_server: RangeServer,
                                                                tmp_path: Path) -> None:
    shard = read_manifest(remote_data)["shards"][0]
    (tmp_path / f"{shard['sha256']}.arrow").write_bytes(bytes(shard["bytes"]))  # a damaged leftover
    labels = torch.cat([b[1] for b in _batches(Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path))])
    assert sorted(labels.tolist()) == list(range(37))


def test_state_taken_over_http_resumes_over_s3_bit_identically(http_server: RangeServer, s3_endpoint: str,
                                                                tmp_path: Path) -> None:
    def make(url: str, **extra: Any) -> Loader:
        return Loader(url, 4, transform=SPEC, seed=5, shuffle="block", block_shards=2, cache_dir=tmp_path / url[:2],
                      **extra)
    reference = _batches(make(http_server.url))
    first = make(http_server.url)
    it = iter(first)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make("s3://data/ds/", storage_options=s3_options(s3_endpoint))
    resumed.load_state_dict(state)
    assert _same(_batches(resumed), reference[3:])


def test_labels_of_a_remote_source_come_from_labels_npy(http_server: RangeServer, tmp_path: Path) -> None:
    loader = Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path, columns=["label", "index"])
    assert np.array_equal(loader.reader.labels(), np.arange(37))  # on construction, from labels.npy
    assert loader.reader.cache.fetched == 0  # and no shard fetched for them
    for _, labels, extras in loader:
        assert torch.equal(labels, extras["index"]) and torch.equal(extras["label"], extras["index"])


def test_labels_of_an_older_remote_dataset_arrive_with_their_shards(remote_data: Path, tmp_path: Path) -> None:
    old = tmp_path / "old"  # as an older stallfree wrote it: no labels.npy
    shutil.copytree(remote_data, old, ignore=shutil.ignore_patterns("labels.npy"))
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["labels"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with RangeServer(old) as server:
        loader = Loader(server.url, 4, transform=SPEC, cache_dir=tmp_path / "cache", columns=["label", "index"])
        assert (loader.reader.labels() == -1).all()  # nothing fetched on construction but the manifest
        for _, labels, extras in loader:
            assert torch.equal(labels, extras["index"]) and torch.equal(extras["label"], extras["index"])
        assert np.array_equal(loader.reader.labels(), np.arange(37))
        loader.close()


def test_an_altered_remote_labels_npy_is_refused_by_name(remote_data: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(remote_data, copy)
    data = bytearray((copy / "labels.npy").read_bytes())
    data[-1] ^= 0x01
    (copy / "labels.npy").write_bytes(bytes(data))
    with RangeServer(copy) as server, pytest.raises(ShardError, match=r"labels.npy: SHA-256 differs from the "
                                                                      r"manifest's .*re-upload the dataset's labels"):
        Loader(server.url, 4, transform=SPEC, cache_dir=tmp_path / "cache")


def test_the_s3_client_goes_through_the_proxy(s3_proxy: FaultProxy, tmp_path: Path) -> None:
    loader = Loader("s3://data/ds/", 4, transform=SPEC, cache_dir=tmp_path,
                    storage_options=s3_options(s3_proxy.url))
    assert sorted(torch.cat([b[1] for b in _batches(loader)]).tolist()) == list(range(37))
    assert s3_proxy.requests > 0


def test_a_loader_dropped_without_close_stops_its_read_ahead(http_server: RangeServer, tmp_path: Path) -> None:
    import gc
    import time

    loader = Loader(http_server.url, 4, transform=SPEC, cache_dir=tmp_path, cache_limit=15000)
    it = iter(loader)
    next(it)
    thread = loader.reader.read_ahead._thread
    assert thread is not None and thread.is_alive()
    del it, loader
    deadline = time.monotonic() + 10.0
    while thread.is_alive() and time.monotonic() < deadline:
        gc.collect()
        thread.join(0.2)
    assert not thread.is_alive()  # it held the reader only while working, so the reader was collected


def test_the_shard_cache_lives_in_the_one_stallfree_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from stallfree.core.home import cache_dir
    from stallfree.pipeline.shard_cache import default_cache_dir

    monkeypatch.setenv("STALLFREE_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine" / "shards" and default_cache_dir().parent == cache_dir()
    monkeypatch.delenv("STALLFREE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "stallfree" / "shards"
