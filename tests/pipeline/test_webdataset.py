"""WebDataset tars read in place (issue 14): brace patterns, the index cache, and the Loader's rules over tars."""

from __future__ import annotations

import io
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from stallfree import Loader
from stallfree.bench.servers import FaultProxy, RangeServer
from stallfree.bench.stores import gcs_options, gcs_server, s3_options, s3_server
from stallfree.ingest.remote import RemoteStoreError, Retry
from stallfree.ingest.runner import ingest
from stallfree.pipeline.samples import BadSampleError
from stallfree.pipeline.webdataset import WebDatasetReader, expand, is_webdataset
from stallfree.transforms import Normalize, RandomHorizontalFlip, RandomResizedCrop

SPEC = [RandomResizedCrop(12), RandomHorizontalFlip(), Normalize()]
PATTERN = "train-{0..2}.tar"


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG")
    return buffer.getvalue()


def _tars(write_tar: Any, root: Path, count: int = 3, per_tar: int = 8) -> Path:
    """``count`` tars of ``per_tar`` 16x16 JPEGs each; a sample's label is its row in the whole set."""
    root.mkdir(parents=True, exist_ok=True)
    for t in range(count):
        write_tar(root / f"train-{t}.tar", [member for i in range(per_tar) for member in (
            (f"s{t}{i}.jpg", _jpeg(t * per_tar + i)), (f"s{t}{i}.cls", str(t * per_tar + i).encode()))])
    return root


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory, write_tar: Any) -> Path:
    return _tars(write_tar, tmp_path_factory.mktemp("wds"))


def _batches(loader: Loader) -> list[tuple[torch.Tensor, ...]]:
    return [tuple(b) for b in loader]


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q, strict=True))
                                    for p, q in zip(a, b, strict=True))


@pytest.mark.parametrize(("pattern", "names"), [
    ("a.tar", ["a.tar"]),
    ("a-{000..002}.tar", ["a-000.tar", "a-001.tar", "a-002.tar"]),
    ("a-{8..10}.tar", ["a-8.tar", "a-9.tar", "a-10.tar"]),
    ("{0..1}/b{08..09}.tar", ["0/b08.tar", "0/b09.tar", "1/b08.tar", "1/b09.tar"]),
    ("https://h/x-{1..1}.tar", ["https://h/x-1.tar"]),
])
def test_brace_patterns_expand_in_order_keeping_the_width(pattern: str, names: list[str]) -> None:
    assert expand(pattern) == names
    assert is_webdataset(pattern)


@pytest.mark.parametrize(("pattern", "match"), [
    ("a-{3..1}.tar", r"runs backwards; write \{1..3\}"),
    ("a-{x..y}.tar", "is not a range"),
    ("a-{1,2}.tar", "is not a range"),
    ("a-{1..2.tar", "unmatched or nested brace"),
    ("a-{0..9}{0..999999}.tar", "names 10000000 tars"),
])
def test_a_malformed_pattern_is_a_value_error(pattern: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        expand(pattern)


def test_other_sources_are_not_webdataset(tmp_path: Path) -> None:
    assert not any(map(is_webdataset, [str(tmp_path), "s3://bucket/train/", "list.csv", 3]))
    assert is_webdataset(tmp_path / "a.tar") and is_webdataset("https://h/a.tar?sig=x")


def test_tars_in_place_give_the_batches_of_the_same_tars_ingested(tars: Path, tmp_path: Path) -> None:
    ingest(tars, tmp_path / "shards")  # one shard: the block shuffle's blocks differ, the global shuffle's order not
    in_place = Loader(str(tars / PATTERN), 4, transform=SPEC, seed=5, cache_dir=tmp_path)
    ingested = Loader(tmp_path / "shards", 4, transform=SPEC, seed=5)
    assert _same(_batches(in_place), _batches(ingested))
    assert in_place.reader.describe(9) == f"{tars / 'train-1.tar'}:s11"


@pytest.mark.parametrize("shuffle", [True, "block"])  # block: a tar is a shard
def test_two_ranks_read_every_sample_once_per_epoch(tars: Path, tmp_path: Path, shuffle: Any) -> None:
    seen = []
    for rank in (0, 1):
        loader = Loader(str(tars / PATTERN), 5, transform=SPEC, seed=2, rank=rank, world_size=2, shuffle=shuffle,
                        cache_dir=tmp_path)
        loader.set_epoch(1)
        seen += torch.cat([labels for _, labels in loader]).tolist()
    assert sorted(seen) == list(range(24))


def test_a_state_taken_mid_epoch_resumes_bit_identically(tars: Path, tmp_path: Path) -> None:
    def make(threads: int) -> Loader:
        return Loader(str(tars / PATTERN), 4, transform=SPEC, seed=7, num_threads=threads, io_threads=threads,
                      cache_dir=tmp_path)

    reference = _batches(make(1))
    first = make(1)
    it = iter(first)
    next(it), next(it)
    resumed = make(2)
    resumed.load_state_dict(first.state_dict())
    assert _same(_batches(resumed), reference[2:])
    other = WebDatasetReader(str(tars / "train-{0..1}.tar"), cache_dir=tmp_path)  # another dataset: refused
    with pytest.raises(ValueError, match="source"):
        Loader(other, 4, transform=SPEC, seed=7).load_state_dict(first.state_dict())


def test_the_index_is_cached_and_a_changed_tar_is_walked_again(tmp_path: Path, write_tar: Any) -> None:
    tars = _tars(write_tar, tmp_path / "wds")
    assert WebDatasetReader(str(tars / PATTERN), cache_dir=tmp_path / "index").walked == 3
    assert len(list((tmp_path / "index").glob("*.json"))) == 3
    again = WebDatasetReader(str(tars / PATTERN), cache_dir=tmp_path / "index")
    assert again.walked == 0 and again.labels().tolist() == list(range(24))
    write_tar(tars / "train-1.tar", [("new.jpg", _jpeg(99)), ("new.cls", b"4")])
    stat = os.stat(tars / "train-1.tar")
    os.utime(tars / "train-1.tar", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later mtime, surely
    changed = WebDatasetReader(str(tars / PATTERN), cache_dir=tmp_path / "index")
    assert changed.walked == 1 and changed.shard_rows() == [8, 1, 8]
    assert changed.read_image(8).tobytes() == _jpeg(99)


def test_tars_over_http_give_the_local_batches(tars: Path, tmp_path: Path) -> None:
    local = _batches(Loader(str(tars / PATTERN), 4, transform=SPEC, seed=3, cache_dir=tmp_path / "a"))
    with RangeServer(tars) as server:
        remote = Loader(f"{server.url}/{PATTERN}", 4, transform=SPEC, seed=3, cache_dir=tmp_path / "b")
        assert _same(_batches(remote), local)
        assert remote.fingerprint() == Loader(str(tars / PATTERN), 4, transform=SPEC, seed=3,
                                              cache_dir=tmp_path / "a").fingerprint()
        remote.close()  # its next epoch's reads, started ahead, end
        walked = server.requests
        again = WebDatasetReader(f"{server.url}/{PATTERN}", cache_dir=tmp_path / "b")
        assert again.walked == 0 and server.requests == walked + 3  # one HEAD per tar: its size and ETag
        secret = server.url.replace("http://", "http://user:hunter2@")
        with pytest.raises(FileNotFoundError, match=r"train-3\.tar does not exist") as missing:
            WebDatasetReader(f"{secret}/train-{{2..3}}.tar?token=hunter2", cache_dir=tmp_path)
        assert "hunter2" not in str(missing.value)


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_tars_on_an_object_store_give_the_local_samples(scheme: str, tars: Path, tmp_path: Path) -> None:
    local = WebDatasetReader(str(tars / PATTERN), cache_dir=tmp_path / "a")
    server, options = (s3_server, s3_options) if scheme == "s3" else (gcs_server, gcs_options)
    with server(tars, bucket="wds", prefix="train") as endpoint:
        remote = WebDatasetReader(f"{scheme}://wds/train/{PATTERN}", cache_dir=tmp_path / "b",
                                  storage_options=options(endpoint))
        picked = (0, 9, 23)
        assert [remote.read_image(i).tobytes() for i in picked] == [local.read_image(i).tobytes() for i in picked]
        assert remote.fingerprint() == local.fingerprint()
        assert remote.describe(9) == f"{scheme}://wds/train/train-1.tar:s11"
        again = WebDatasetReader(f"{scheme}://wds/train/{PATTERN}", cache_dir=tmp_path / "b",
                                 storage_options=options(endpoint))
        assert again.walked == 0  # keyed by the object's ETag


def test_a_failing_store_is_retried_then_named_without_credentials(tars: Path, tmp_path: Path) -> None:
    with RangeServer(tars) as server, FaultProxy(server.url) as proxy:
        url = proxy.url.replace("http://", "http://user:hunter2@") + f"/{PATTERN}?token=hunter2"
        retry = Retry(attempts=2, backoff=0.01)
        proxy.inject("503", count=1, match=".tar")  # the index walk's first read: tried again
        reader = WebDatasetReader(url, cache_dir=tmp_path, retry=retry)
        proxy.inject("503", count=1, match=".tar")
        assert reader.read_image(9).tobytes() == _jpeg(9)
        proxy.inject("503", count=2, match=".tar")
        with pytest.raises(RemoteStoreError, match=r"train-1\.tar: 2 tries failed") as failed:
            reader.read_image(9)
        assert "hunter2" not in str(failed.value) and len(proxy.met) == 4


def test_a_missing_tar_is_named(tars: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"train-3\.tar does not exist \(from .*train-\{0\.\.3\}\.tar\)"):
        Loader(str(tars / "train-{0..3}.tar"), 4, transform=SPEC, cache_dir=tmp_path)


def test_a_truncated_or_compressed_tar_is_named(tmp_path: Path, write_tar: Any) -> None:
    tars = _tars(write_tar, tmp_path / "wds", count=2)
    with tarfile.open(tars / "train-1.tar", "r:") as tar:
        cut = tar.getmember("s13.jpg").offset_data + 10
    with open(tars / "train-1.tar", "r+b") as f:
        f.truncate(cut)  # s13.jpg's header says more bytes follow than the tar holds
    with pytest.raises(ValueError, match=r"train-1\.tar:s13\.jpg: the tar member's header claims \d+ bytes but "
                                         r"the tar holds 10 after it \(truncated"):
        WebDatasetReader(str(tars / "train-{0..1}.tar"), cache_dir=tmp_path)
    with tarfile.open(tars / "train-1.tar", "w:gz") as tar:
        tar.add(tars / "train-0.tar", "a.jpg")
    with pytest.raises(ValueError, match=r"train-1\.tar is compressed"):
        WebDatasetReader(str(tars / "train-{0..1}.tar"), cache_dir=tmp_path)


def test_refused_samples_raise_or_are_left_out_as_on_error_says(tmp_path: Path, write_tar: Any) -> None:
    write_tar(tmp_path / "a.tar", [("ok.jpg", _jpeg(0)), ("ok.cls", b"1"), ("bad.jpg", _jpeg(1)),
                                    ("bad.cls", b"cat"), ("alone.jpg", _jpeg(2))])
    with pytest.raises(ValueError, match=r"a\.tar:bad: \.cls is not a non-negative integer: 'cat' \(2 sample\(s\) "
                                         r"refused .*on_error='skip'"):
        Loader(str(tmp_path / "a.tar"), 1, transform=SPEC, cache_dir=tmp_path)
    with pytest.warns(UserWarning, match="2 sample"):
        reader = WebDatasetReader(tmp_path / "a.tar", cache_dir=tmp_path, on_error="skip")
    assert len(reader) == 1 and [r["path"] for r in reader.rejected] == [
        f"{tmp_path / 'a.tar'}:bad", f"{tmp_path / 'a.tar'}:alone"]


def test_a_sample_that_fails_to_decode_is_named_by_tar_and_member(tmp_path: Path, write_tar: Any) -> None:
    write_tar(tmp_path / "a.tar", [("s0.jpg", _jpeg(0)), ("s0.cls", b"0"), ("s1.jpg", b"not an image"),
                                    ("s1.cls", b"1")])
    with pytest.raises(BadSampleError, match=r"a\.tar:s1"):
        _batches(Loader(str(tmp_path / "a.tar"), 2, transform=SPEC, cache_dir=tmp_path))
    skipping = Loader(str(tmp_path / "a.tar"), 1, transform=SPEC, cache_dir=tmp_path, on_error="skip")
    assert torch.cat([labels for _, labels in skipping]).tolist() == [0, 0]  # s1's place is filled
    assert [s["source"] for s in skipping.skipped] == [f"{tmp_path / 'a.tar'}:s1"]


def test_shard_cache_keywords_are_refused(tars: Path) -> None:
    with pytest.raises(ValueError, match=r"cache_limit= apply to an ingested dataset at a URL, not to WebDataset "
                                         r"tars on local disk .* which take only cache_dir="):
        Loader(str(tars / PATTERN), 4, transform=SPEC, cache_limit=1 << 20)


def _fetched(reader: WebDatasetReader, rows: np.ndarray, steps: int = 1) -> None:
    """Hand ``rows`` to the read-ahead and wait until ``steps`` fetches have ended."""
    ahead = reader.read_ahead
    assert ahead is not None
    ahead.follow(rows)
    for _ in range(500):
        if ahead.fetches >= steps:
            return
        time.sleep(0.01)
    raise AssertionError("the read-ahead fetched nothing in 5 s")


def test_tars_at_a_url_are_read_ahead_in_merged_ranges(tars: Path, tmp_path: Path) -> None:
    local = WebDatasetReader(str(tars / PATTERN), cache_dir=tmp_path / "a")
    assert local.read_ahead is None  # a local tar is read where it lies
    rows = np.random.default_rng(0).permutation(len(local))  # a stretch of rows spread over every tar
    with RangeServer(tars) as server:
        reader = WebDatasetReader(f"{server.url}/{PATTERN}", cache_dir=tmp_path / "b")
        before = server.requests
        _fetched(reader, rows)
        assert server.requests == before + 3  # the 24 samples' ranges merged: one request per tar
        assert [reader.read_image(int(r)).tobytes() for r in rows] == [local.read_image(int(r)).tobytes() for r in rows]
        assert server.requests == before + 3 and reader.read_ahead.hits == 24
        reader.close()


def test_a_read_ahead_that_fails_leaves_the_reads_to_the_store(tars: Path, tmp_path: Path) -> None:
    local = WebDatasetReader(str(tars / PATTERN), cache_dir=tmp_path / "a")
    rows = np.arange(len(local))[::-1]
    with RangeServer(tars) as server, FaultProxy(server.url) as proxy:
        reader = WebDatasetReader(f"{proxy.url}/{PATTERN}", cache_dir=tmp_path / "b",
                                  retry=Retry(attempts=2, backoff=0.01))
        proxy.inject("503", count=1, match="train-1.tar")
        proxy.inject("truncate", count=1, match="train-2.tar")
        _fetched(reader, rows)
        assert [reader.read_image(int(r)).tobytes() for r in rows] == [local.read_image(int(r)).tobytes() for r in rows]
        assert reader.read_ahead.hits == 8 and reader.read_ahead.misses == 16  # train-0's 8 came ahead
        reader.close()


def test_read_ahead_keywords_apply_to_tars_at_a_url_only(tars: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"downloads= apply to an ingested dataset at a URL, not to WebDataset tars on "
                                         r"local disk"):
        Loader(str(tars / PATTERN), 4, transform=SPEC, downloads=2)
    with RangeServer(tars) as server:
        loader = Loader(f"{server.url}/{PATTERN}", 4, transform=SPEC, cache_dir=tmp_path, downloads=2,
                        read_ahead=1 << 16)
        assert loader.reader.downloads == 2 and loader.reader.read_ahead.budget == 1 << 16
        with pytest.raises(ValueError, match="read_ahead must be a positive number of bytes"):
            Loader(f"{server.url}/{PATTERN}", 4, transform=SPEC, cache_dir=tmp_path, read_ahead=-1)
        loader.close()
