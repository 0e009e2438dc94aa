"""Data behind a server that ignores Range, as ``python -m http.server`` does (issue 44, item 7).

The server is the standard library's own handler (``stallfree.bench.servers.PlainServer``) on 127.0.0.1: a ranged
GET gets ``200`` and the whole file. Shards are taken whole from that reply, once, checked by size and SHA-256;
WebDataset tars are fetched whole into a bounded folder and read there; only wrong bytes are an error.
"""

from __future__ import annotations

import gc
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from stallfree import BadSampleError, Loader, RemoteStoreError
from stallfree.bench.servers import PlainServer
from stallfree.transforms import Normalize, RandomResizedCrop

SPEC = [RandomResizedCrop(12), Normalize()]
FAST = {"retries": 2, "remote_timeout": 5.0}


def _batches(loader: Loader, epochs: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out += [(b[0], b[1]) for b in loader]
    return out


def _same(a: list[tuple[torch.Tensor, torch.Tensor]], b: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    if len(a) != len(b):
        return False
    return all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True))


def _gets(server: PlainServer, suffix: str) -> list[tuple[str, str | None]]:
    """(path, Range header) of every GET of a file ending in ``suffix``, in order."""
    with server.lock:
        return [(path, ranged) for method, path, ranged in server.seen if method == "GET" and path.endswith(suffix)]


def test_shards_behind_python_http_server_load_as_from_local_disk(remote_data: Path, tmp_path: Path) -> None:
    # was: RemoteStoreError "the server ignored the ranged request (HTTP 200, not 206 Partial Content ...)"
    kw: dict[str, Any] = {"transform": SPEC, "shuffle": True, "seed": 5}
    local = _batches(Loader(remote_data, 4, **kw), epochs=2)
    with PlainServer(remote_data) as server:
        loader = Loader(server.url, 4, cache_dir=tmp_path / "cache", **FAST, **kw)
        assert _same(_batches(loader, epochs=2), local)
        loader.close()
    shards = Counter(path for path, _ in _gets(server, ".arrow"))
    assert len(shards) == 10 and set(shards.values()) == {1}  # each shard's body once: the first reply taken whole


def test_a_shard_fetched_again_is_asked_for_whole(remote_data: Path, tmp_path: Path) -> None:
    # a cache of two shards under a global shuffle fetches shards again within the pass: no more ranges for them
    kw: dict[str, Any] = {"transform": SPEC, "shuffle": True, "seed": 1}
    local = _batches(Loader(remote_data, 4, **kw), epochs=2)
    largest = max(p.stat().st_size for p in remote_data.glob("shard-*.arrow"))
    with PlainServer(remote_data) as server:
        loader = Loader(server.url, 4, cache_dir=tmp_path / "cache", cache_limit=2 * largest, downloads=1, **FAST,
                        **kw)
        assert _same(_batches(loader, epochs=2), local)
        loader.close()
    gets = _gets(server, ".arrow")
    assert len(gets) > 10  # shards were evicted and fetched again
    for shard in {path for path, _ in gets}:
        asked = [ranged for path, ranged in gets if path == shard]
        assert asked[0] is not None and all(ranged is None for ranged in asked[1:]), (shard, asked)


def test_wrong_bytes_from_a_server_that_ignores_range_are_an_error(remote_data: Path, tmp_path: Path) -> None:
    # only a server that sends wrong bytes is an error: a flipped byte (SHA-256), and an object longer than listed
    folder = tmp_path / "ds"
    shutil.copytree(remote_data, folder)
    damaged = bytearray((folder / "shard-00001.arrow").read_bytes())
    damaged[100] ^= 0xFF
    (folder / "shard-00001.arrow").write_bytes(bytes(damaged))
    with open(folder / "shard-00002.arrow", "ab") as f:
        f.write(b"more")
    with PlainServer(folder) as server:
        loader = Loader(server.url, 4, transform=SPEC, cache_dir=tmp_path / "c1", shuffle=False, **FAST)
        with pytest.raises(BadSampleError, match=r"shard-00001\.arrow.*SHA-256 .* differs from the manifest's"):
            _batches(loader)
        loader.close()
        (folder / "shard-00001.arrow").write_bytes((remote_data / "shard-00001.arrow").read_bytes())
        loader = Loader(server.url, 4, transform=SPEC, cache_dir=tmp_path / "c2", shuffle=False, **FAST)
        with pytest.raises(RemoteStoreError, match=r"http://127\.0\.0\.1:\d+/shard-00002\.arrow: the object is "
                                                   r"longer than the manifest's \d+ bytes"):
            _batches(loader)
        loader.close()


def _png(seed: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (9, 7, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def tars(tmp_path: Path, write_tar: Any) -> Path:
    """Three WebDataset tars of 7 samples each, labels 0..4."""
    folder = tmp_path / "tars"
    folder.mkdir()
    for t in range(3):
        write_tar(folder / f"t-{t}.tar", [member for i in range(7) for member in (
            (f"s{t}{i}.png", _png(t * 7 + i)), (f"s{t}{i}.cls", b"%d" % ((t * 7 + i) % 5)))])
    return folder


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_tars_behind_python_http_server_load_as_from_local_disk(tars: Path, tmp_path: Path, shuffle: Any) -> None:
    # was: RemoteStoreError ".../t-0.tar: the server ignored the ranged request" while indexing
    kw: dict[str, Any] = {"transform": SPEC, "shuffle": shuffle, "seed": 2, "block_shards": 2}
    local = _batches(Loader(str(tars / "t-{0..2}.tar"), 4, cache_dir=tmp_path / "local-index", **kw), epochs=2)
    with PlainServer(tars) as server:
        url = f"{server.url}/t-{{0..2}}.tar"
        for run in range(2):  # the second finds the indexes kept: the read-ahead meets the server first
            loader = Loader(url, 4, cache_dir=tmp_path / "index", **FAST, **kw)
            assert loader.reader.walked == (3 if run == 0 else 0)
            assert _same(_batches(loader, epochs=2), local)
            loader.close()
            gets = _gets(server, ".tar")
            for tar in (f"/t-{t}.tar" for t in range(3)):
                asked = [ranged for path, ranged in gets if path == tar]
                # one ranged request met the 200 (closed before its body), then one whole GET, for two epochs
                assert len(asked) == 2 and asked[0] is not None and asked[1] is None, (tar, asked)
            with server.lock:
                server.seen.clear()


def test_a_tar_over_the_cache_limit_behind_a_server_that_ignores_range_is_named(tars: Path, tmp_path: Path) -> None:
    sizes = [(tars / f"t-{t}.tar").stat().st_size for t in range(3)]
    with PlainServer(tars) as server:
        url = f"{server.url}/t-{{0..2}}.tar"
        with pytest.raises(RemoteStoreError, match=rf"http://127\.0\.0\.1:\d+/t-0\.tar: the server ignores Range .*"
                                                   rf"its {sizes[0]} bytes exceed cache_limit={min(sizes) - 1}; give "
                                                   rf"cache_limit={sizes[0]} or more"):
            Loader(url, 4, transform=SPEC, cache_dir=tmp_path / "index", cache_limit=min(sizes) - 1, **FAST)
        # the largest tar fits: they take turns in the folder
        loader = Loader(url, 4, transform=SPEC, cache_dir=tmp_path / "index", cache_limit=max(sizes), **FAST)
        assert sorted(torch.cat([b[1] for b in loader]).tolist()) == sorted(i % 5 for i in range(21))
        loader.close()


def test_the_whole_tars_folder_goes_with_its_reader_and_one_left_by_a_killed_process_is_swept(tars: Path,
                                                                                               tmp_path: Path) -> None:
    left = tmp_path / "index" / "whole-tars" / "pid1-killed"
    left.mkdir(parents=True)
    (left / ".lock").touch()  # its process held it: no more
    (left / "x.arrow").write_bytes(b"a tar")
    os.utime(left, (1, 1))
    with PlainServer(tars) as server:
        loader = Loader(f"{server.url}/t-{{0..2}}.tar", 4, transform=SPEC, cache_dir=tmp_path / "index", **FAST)
    assert not left.exists()
    (mine,) = (tmp_path / "index" / "whole-tars").iterdir()
    assert len(list(mine.glob("*.arrow"))) == 3
    del loader
    gc.collect()
    assert not mine.exists()
