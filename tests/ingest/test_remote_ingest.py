"""Ingest to a URL: every shard uploaded once complete, the manifest last; verify and info over s3:// and http://.

Real servers on 127.0.0.1 (moto's S3 server, the Range HTTP server, the fault proxy in front of S3), as in
``tests/pipeline``; no client is mocked.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stallfree.bench.servers import FaultProxy, RangeServer
from stallfree.bench.stores import s3_options, s3_server
from stallfree.cli import main
from stallfree.ingest import runner
from stallfree.ingest.remote import RemoteStoreError, Retry
from stallfree.ingest.runner import ingest
from stallfree.ingest.upload import default_staging
from stallfree.ingest.verify import info, verify
from stallfree.ingest.writer import IngestOptions

OPTIONS = IngestOptions(shard_mb=0.006)  # the 37 small PNGs in about 9 shards
FAST = Retry(attempts=2, backoff=0.01, max_backoff=0.01, timeout=10)


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3 server with an empty bucket ``out``; its endpoint."""
    with s3_server(bucket="out") as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def reference(indexed_list: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a local ingest of the same source writes."""
    out = tmp_path_factory.mktemp("reference")
    ingest(indexed_list, out, OPTIONS)
    return out


def _client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


def _objects(endpoint: str, prefix: str) -> dict[str, int]:
    """Name -> size of the objects under ``s3://out/<prefix>/``, listed with boto3 (not the client under test)."""
    reply = _client(endpoint).list_objects_v2(Bucket="out", Prefix=f"{prefix}/")
    return {o["Key"].rsplit("/", 1)[1]: o["Size"] for o in reply.get("Contents", [])}


def _files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}


def _puts(proxy: FaultProxy) -> list[str]:
    """The object names the client uploaded through ``proxy``, sorted."""
    return sorted(line.split("?")[0].rsplit("/", 1)[1] for line in proxy.seen if line.startswith("PUT "))


def test_ingest_to_s3_uploads_what_a_local_ingest_writes_and_the_loader_reads_it(
        indexed_list: Path, reference: Path, s3: str, tmp_path: Path) -> None:
    summary = ingest(indexed_list, "s3://out/ds/", OPTIONS, storage_options=s3_options(s3))
    # every shard, labels.npy, rejected.jsonl and the manifest; nothing else
    assert _objects(s3, "ds") == _files(reference)
    manifest = _client(s3).get_object(Bucket="out", Key="ds/manifest.json")["Body"].read()
    assert manifest == (reference / "manifest.json").read_bytes()
    assert summary["uploaded_shards"] == summary["shards"] > 3 and summary["stored_shards"] == 0
    assert summary["url"] == "s3://out/ds" and summary["staging"] is None
    assert not default_staging("s3://out/ds/", s3_options(s3)).exists()  # the default staging folder is gone

    from stallfree import Loader
    from stallfree.transforms import Normalize, RandomResizedCrop

    loader = Loader("s3://out/ds/", 4, transform=[RandomResizedCrop(12), Normalize()], cache_dir=tmp_path,
                    storage_options=s3_options(s3))
    labels = sorted(int(label) for _, batch in loader for label in batch)
    loader.close()
    assert labels == list(range(37))  # every sample exactly once


@pytest.mark.slow
def test_ingest_to_gcs_then_verify_and_read_it(indexed_list: Path, reference: Path, tmp_path: Path) -> None:
    from stallfree.bench.stores import gcs_options, gcs_server

    with gcs_server(bucket="out") as endpoint:
        options = gcs_options(endpoint)
        summary = ingest(indexed_list, "gs://out/ds/", OPTIONS, storage_options=options)
        assert summary["uploaded_shards"] == summary["shards"] > 3
        assert verify("gs://out/ds/", storage_options=options) == []
        assert info("gs://out/ds/", storage_options=options)["rows"] == 37

        from stallfree import Loader
        from stallfree.transforms import Normalize, RandomResizedCrop

        loader = Loader("gs://out/ds/", 4, transform=[RandomResizedCrop(12), Normalize()], cache_dir=tmp_path,
                        storage_options=options)
        labels = sorted(int(label) for _, batch in loader for label in batch)
        loader.close()
    assert labels == list(range(37))  # every sample exactly once


def test_ingest_to_a_file_url_writes_what_a_local_ingest_writes(indexed_list: Path, reference: Path,
                                                                 tmp_path: Path) -> None:
    store = tmp_path / "store"
    summary = ingest(indexed_list, store.as_uri() + "/", OPTIONS)
    assert _files(store) == _files(reference)  # no temporary file left beside the shards
    assert {p.name: p.read_bytes() for p in store.iterdir()} == {p.name: p.read_bytes() for p in reference.iterdir()
                                                                if p.is_file()}
    assert summary["uploaded_shards"] == summary["shards"]


@pytest.mark.slow
def test_a_failed_upload_leaves_no_manifest_and_a_rerun_uploads_only_what_is_missing(
        indexed_list: Path, reference: Path, s3: str, tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    with FaultProxy(s3) as proxy:
        proxy.inject("503", count=1000, match="shard-00003.arrow", method="PUT")
        with pytest.raises(RemoteStoreError, match=r"uploading shard-00003\.arrow to "
                           r"s3://out/fault/shard-00003\.arrow: 2 tries failed .*run the ingest again"):
            ingest(indexed_list, "s3://out/fault/", OPTIONS, staging=staging, storage_options=s3_options(proxy.url),
                   retry=FAST)
    first = _objects(s3, "fault")
    assert "manifest.json" not in first and "shard-00003.arrow" not in first
    assert {"shard-00000.arrow", "shard-00001.arrow", "shard-00002.arrow"} <= set(first)
    with FaultProxy(s3) as proxy:
        summary = ingest(indexed_list, "s3://out/fault/", OPTIONS, staging=staging,
                         storage_options=s3_options(proxy.url))
        puts = _puts(proxy)
    shards = sorted(name for name in _files(reference) if name.startswith("shard-"))
    assert puts == sorted([name for name in shards if name not in first]
                          + ["labels.npy", "manifest.json", "rejected.jsonl"])
    order = [line.split("?")[0].rsplit("/", 1)[1] for line in proxy.seen if line.startswith("PUT ")]
    assert order[-3:] == ["labels.npy", "rejected.jsonl", "manifest.json"]  # last: after every shard
    assert summary["stored_shards"] == len(first) and summary["uploaded_shards"] == len(shards) - len(first)
    assert _objects(s3, "fault") == _files(reference)
    assert summary["staging"] == str(staging) and staging.is_dir()  # a staging folder the caller named is kept
    assert verify("s3://out/fault/", storage_options=s3_options(s3)) == []


def _slow_ingest(source: Path, url: str, staging: Path, options: dict[str, Any]) -> None:
    write = runner.write_shard

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return write(*args, **kwargs)

    runner.write_shard = slow  # type: ignore[assignment]  # this child process only
    ingest(source, url, OPTIONS, staging=staging, storage_options=options)


@pytest.mark.slow
def test_kill_9_mid_ingest_then_rerun_uploads_only_what_is_missing(
        indexed_list: Path, reference: Path, s3: str, tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    receipts = staging / ".ingest" / "uploaded"
    # spawn, not fork: a fork of this process (DALI's and torch's threads running) can die of SIGSEGV on its own
    child = multiprocessing.get_context("spawn").Process(
        target=_slow_ingest, args=(indexed_list, "s3://out/killed/", staging, s3_options(s3)))
    child.start()
    deadline = time.monotonic() + 60
    while len(list(receipts.glob("*.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert "manifest.json" not in _objects(s3, "killed"), "the ingest finished before the kill: make the data larger"
    done = sorted(p.stem + ".arrow" for p in receipts.glob("*.json"))
    with FaultProxy(s3) as proxy:
        summary = ingest(indexed_list, "s3://out/killed/", OPTIONS, staging=staging,
                         storage_options=s3_options(proxy.url))
        puts = _puts(proxy)
    assert len(done) >= 3 and not set(done) & set(puts)  # a shard uploaded before the kill is not uploaded again
    assert summary["stored_shards"] == len(done) and summary["stored_shards"] + summary["uploaded_shards"] == \
        summary["shards"]
    assert _objects(s3, "killed") == _files(reference)


@pytest.mark.parametrize("kind", ["s3", "http"])
def test_verify_and_info_read_a_dataset_at_a_url(kind: str, indexed_list: Path, reference: Path, s3: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with RangeServer(reference) as http:
        if kind == "s3":
            ingest(indexed_list, "s3://out/check/", OPTIONS, storage_options=s3_options(s3))
            url, options = "s3://out/check/", s3_options(s3)
        else:
            url, options = http.url + "/", None
        flags = ["--storage-options", json.dumps(options)] if options else []
        assert verify(url, storage_options=options, decode=True) == []
        assert info(url, options) == info(reference)
        capsys.readouterr()
        assert main(["info", url, "--json", *flags]) == 0
        assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(info(reference)))
        assert main(["verify", url, *flags]) == 0
        assert capsys.readouterr().err.strip().endswith(": OK")


def test_a_corrupted_remote_shard_fails_verify_naming_it(indexed_list: Path, s3: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    ingest(indexed_list, "s3://out/bad/", OPTIONS, storage_options=s3_options(s3))
    client = _client(s3)
    data = bytearray(client.get_object(Bucket="out", Key="bad/shard-00001.arrow")["Body"].read())
    data[100] ^= 0xFF  # the same size: only the checksum can tell
    client.put_object(Bucket="out", Key="bad/shard-00001.arrow", Body=bytes(data))
    named = "shard-00001.arrow (s3://out/bad/shard-00001.arrow): SHA-256 differs from the manifest's"
    problems = verify("s3://out/bad/", storage_options=s3_options(s3))
    assert len(problems) == 1 and problems[0].startswith(named)
    capsys.readouterr()
    assert main(["verify", "s3://out/bad/", "--storage-options", json.dumps(s3_options(s3))]) == 1
    captured = capsys.readouterr()
    assert named in captured.out and "s3://out/bad/: 1 problem(s)" in captured.err


def test_a_remote_labels_file_longer_than_listed_is_a_problem_not_read_whole(indexed_list: Path, s3: str) -> None:
    # was: verify fetched labels.npy with no bound (a store could send gigabytes), and an oversize one escaped as
    # a ValueError instead of being listed
    ingest(indexed_list, "s3://out/longlabels/", OPTIONS, storage_options=s3_options(s3))
    client = _client(s3)
    data = client.get_object(Bucket="out", Key="longlabels/labels.npy")["Body"].read()
    client.put_object(Bucket="out", Key="longlabels/labels.npy", Body=data + bytes(4 << 20))
    problems = verify("s3://out/longlabels/", storage_options=s3_options(s3))
    assert any("labels.npy" in problem and "s3://out/longlabels/labels.npy" in problem for problem in problems), \
        problems


def test_parts_ingested_to_s3_then_merged_there_hold_a_one_part_ingest(
        indexed_list: Path, reference: Path, s3: str, tmp_path: Path) -> None:
    options = s3_options(s3)
    for i in (1, 0, 2):  # as three machines would, in any order
        summary = ingest(indexed_list, "s3://out/split/", OPTIONS, part=(i, 3), storage_options=options)
        assert summary["uploaded_shards"] == summary["shards"]
        assert not default_staging("s3://out/split/", options, (i, 3)).exists()
    stored = _objects(s3, "split")
    assert "manifest.json" not in stored and {"manifest.part-2-of-3.json", "labels.part-2-of-3.npy"} <= set(stored)
    assert main(["ingest", "--merge", "s3://out/split/", "--storage-options", json.dumps(options)]) == 0
    body = {name: _client(s3).get_object(Bucket="out", Key=f"split/{name}")["Body"].read()
            for name in ("labels.npy", "rejected.jsonl", "manifest.json")}
    for name in ("labels.npy", "rejected.jsonl"):
        assert body[name] == (reference / name).read_bytes(), name
    merged, one = json.loads(body["manifest.json"]), json.loads((reference / "manifest.json").read_text())
    assert (merged["rows"], merged["classes"], merged["class_counts"]) == (one["rows"], one["classes"],
                                                                          one["class_counts"])
    assert verify("s3://out/split/", storage_options=options) == []

    from stallfree import Loader
    from stallfree.transforms import Normalize, RandomResizedCrop

    loader = Loader("s3://out/split/", 4, transform=[RandomResizedCrop(12), Normalize()], cache_dir=tmp_path,
                    storage_options=options)
    labels = sorted(int(label) for _, batch in loader for label in batch)
    loader.close()
    assert labels == list(range(37))  # every sample exactly once


def test_a_merge_at_a_url_with_a_part_missing_uploads_nothing(indexed_list: Path, s3: str) -> None:
    options = s3_options(s3)
    ingest(indexed_list, "s3://out/halfway/", OPTIONS, part=(0, 2), storage_options=options)
    from stallfree.ingest.merge import merge

    with pytest.raises(ValueError, match=r"s3://out/halfway: expected parts 0..1 of 2"):
        merge("s3://out/halfway/", storage_options=options)
    assert "manifest.json" not in _objects(s3, "halfway")


@pytest.mark.parametrize(("argv", "message"), [
    (["ingest", "SRC", "https://user:secret@example.invalid/ds/"],
     "cannot ingest to https://example.invalid/ds/: https:// is read-only here"),
    (["ingest", "--merge", "s3://out/nothing/"], "no manifest.part-I-of-N.json in s3://out/nothing: run"),
    (["ingest", "SRC", "./local", "--staging", "/tmp/x"], "--staging and --storage-options apply to an OUT at a URL"),
    (["info", "s3://out/nothing/"], "s3://out/nothing/manifest.json does not exist"),
])
def test_cli_errors_are_one_line_without_credentials(argv: list[str], message: str, indexed_list: Path, s3: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(indexed_list) if a == "SRC" else a for a in argv]
    if argv[0] == "info" or "--merge" in argv:
        argv += ["--storage-options", json.dumps(s3_options(s3))]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "secret" not in err
