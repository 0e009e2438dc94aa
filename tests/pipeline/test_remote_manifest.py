"""A manifest is not trusted: bounded in size and in time, its whole schema checked, its files inside the dataset.

Issue #37, case 5. The remote cases run against the HTTP range server and the fault proxy on 127.0.0.1; the schema
cases against a local copy of an ingested folder, since one check serves both (and ``stallfree verify``).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from stallfree import Loader, RemoteStoreError, ShardReader
from stallfree.bench.servers import FaultProxy, RangeServer
from stallfree.ingest.manifest import MANIFEST_LIMIT, read_manifest
from stallfree.ingest.verify import verify
from stallfree.transforms import Normalize, RandomResizedCrop

FAST = {"retries": 2, "remote_timeout": 2.0, "transform": [RandomResizedCrop(12), Normalize()]}


def _copy(remote_data: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path / "ds"
    shutil.copytree(remote_data, folder)
    return folder, json.loads((folder / "manifest.json").read_text())


def _write(folder: Path, manifest: Any) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_an_endless_manifest_is_refused_at_the_limit(http_proxy: FaultProxy, tmp_path: Path) -> None:
    # was: an endless manifest passed 4 GB of memory in 17 s
    http_proxy.inject("endless", count=10**6, match="manifest.json")
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"http://127\.0\.0\.1:\d+/manifest\.json is larger than {MANIFEST_LIMIT} "
                                         "bytes"):
        Loader(http_proxy.url, 4, cache_dir=tmp_path, **FAST)
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_a_manifest_trickled_byte_by_byte_is_given_up_within_the_timeout(http_proxy: FaultProxy,
                                                                         tmp_path: Path) -> None:
    # was: a manifest sent at 1 B/s kept Loader() blocked past 40 s
    http_proxy.inject("trickle", count=10**6, match="manifest.json", rate=2.0)
    start = time.monotonic()
    with pytest.raises(RemoteStoreError, match=r"manifest\.json: did not arrive within 2 s"):
        Loader(http_proxy.url, 4, cache_dir=tmp_path, **FAST)
    assert time.monotonic() - start < 30  # 2 s, on a loaded machine


def test_a_deeply_nested_manifest_is_a_value_error(remote_data: Path, tmp_path: Path) -> None:
    # was: RecursionError
    folder, _ = _copy(remote_data, tmp_path)
    (folder / "manifest.json").write_text("[" * 200_000)
    with pytest.raises(ValueError, match=r"manifest\.json is not a stallfree manifest: its JSON is nested too deeply"):
        read_manifest(folder)
    with RangeServer(folder) as server, pytest.raises(ValueError, match=r"/manifest\.json is not a stallfree"):
        Loader(server.url, 4, cache_dir=tmp_path / "cache", **FAST)


def test_a_manifest_over_the_limit_on_disk_is_refused(remote_data: Path, tmp_path: Path) -> None:
    folder, _ = _copy(remote_data, tmp_path)
    with open(folder / "manifest.json", "ab") as f:
        f.truncate(MANIFEST_LIMIT + 1)
    with pytest.raises(ValueError, match=rf"manifest\.json is larger than {MANIFEST_LIMIT} bytes"):
        ShardReader(folder)


def _set(manifest: dict[str, Any], field: str, value: Any) -> None:
    """``field`` (``shards.0.rows``) of ``manifest`` set to ``value``, or removed if ``value`` is ``...``."""
    *parents, last = field.split(".")
    target: Any = manifest
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    key: Any = int(last) if isinstance(target, list) else last
    if value is ...:
        del target[key]
    else:
        target[key] = value


@pytest.mark.parametrize(("field", "value", "named"), [
    ("shards", {}, r"shards must be a list"),
    ("shards.0", None, r"shards\[0\] must be an object"),
    ("shards.0.rows", "7", r"shards\[0\]\.rows must be a count"),
    ("shards.0.bytes", -1, r"shards\[0\]\.bytes must be a count"),
    ("shards.0.sha256", 5, r"shards\[0\]\.sha256 must be 64 lowercase hex digits"),
    ("shards.0.file", ..., r"shards\[0\]\.file must be a plain file name"),
    ("rows", 10**9, r"rows must be the sum of the shards' rows \(37\)"),
    ("rows", ..., r"rows must be present"),
    ("classes", 3, r"classes must be a list of strings"),
    ("class_counts", {"0": 1}, r"class_counts must be a list of counts"),
    ("schema.0", "key", r"schema\[0\] must be a"),
    ("image", [], r"image\.kind must be 'encoded' or 'raw'"),
    ("image.shape", "big", r"image\.shape must be \[height, width, 3\] or null"),
    ("labels.dtype", None, r"labels\.dtype must be a NumPy dtype's name"),
    ("labels.file", "/etc/passwd", r"labels\.file must be a plain file name"),
    ("version", True, r"has format version True"),
])
def test_a_manifest_field_of_the_wrong_type_is_named(field: str, value: Any, named: str, remote_data: Path,
                                                     tmp_path: Path) -> None:
    # was: TypeError, KeyError or AttributeError from wherever the field was first used
    folder, manifest = _copy(remote_data, tmp_path)
    _set(manifest, field, value)
    _write(folder, manifest)
    with pytest.raises(ValueError, match=rf"manifest\.json(: | ){named}"):
        ShardReader(folder)


@pytest.mark.parametrize("name", ["../outside/shard-00000.arrow", "/etc/hosts", "sub/shard-00000.arrow", "..",
                                  ".hidden.arrow", "a\\b.arrow"])
def test_a_shard_name_outside_the_dataset_is_refused_by_readers_and_verify(name: str, remote_data: Path,
                                                                          tmp_path: Path) -> None:
    # was: ../outside/shard-00000.arrow was read, and verify passed
    folder, manifest = _copy(remote_data, tmp_path)
    (tmp_path / "outside").mkdir()
    shutil.copy(folder / "shard-00000.arrow", tmp_path / "outside" / "shard-00000.arrow")
    manifest["shards"][0]["file"] = name
    _write(folder, manifest)
    named = r"manifest\.json: shards\[0\]\.file must be a plain file name in the dataset's folder"
    with pytest.raises(ValueError, match=named):
        Loader(folder, 4, transform=FAST["transform"])
    with pytest.raises(ValueError, match=named):
        verify(folder)
    with RangeServer(tmp_path) as server, pytest.raises(ValueError, match=named):
        Loader(f"{server.url}/ds/", 4, cache_dir=tmp_path / "cache", **FAST)


def test_an_ingested_manifest_passes_every_check(remote_data: Path) -> None:
    manifest = read_manifest(remote_data)
    assert manifest["rows"] == sum(s["rows"] for s in manifest["shards"]) == 37
