"""Damaged and oversized WebDataset tars: a bad member costs the rest of its tar, never the ingest (issue 10, 11-12)."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from stallfree.cli import main
from stallfree.ingest.manifest import REJECTED
from stallfree.ingest.runner import ingest
from stallfree.ingest.writer import IngestOptions


def _rejected(out: Path) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in map(json.loads, (out / REJECTED).read_text().splitlines())}


def _sample(name: str, image: bytes, label: int) -> list[tuple[str, bytes]]:
    return [(f"{name}.jpg", image), (f"{name}.cls", str(label).encode())]


def _offset_of(path: Path, member: str) -> int:
    """Where ``member``'s header starts in the tar at ``path``."""
    with tarfile.open(path, "r:") as tar:
        return tar.getmember(member).offset


def test_a_member_claiming_more_bytes_than_the_tar_holds_rejects_the_rest_of_that_tar_only(
        tmp_path, encode, shard_rows, write_tar):
    # Before: `tarfile.ReadError: unexpected end of data` ended the ingest with no manifest and no rejected.jsonl.
    src = tmp_path / "src"
    src.mkdir()
    write_tar(src / "a.tar", _sample("s0", encode(0), 0) + _sample("s1", encode(1), 1)
               + [("big.jpg", encode(2, (200, 200))), ("big.cls", b"0"), ("after.jpg", encode(3)), ("after.cls", b"1")])
    with tarfile.open(src / "a.tar", "r:") as tar:
        big = tar.getmember("big.jpg")
    with open(src / "a.tar", "r+b") as f:
        f.truncate(big.offset_data + 100)  # the header says big.size bytes follow; 100 do
    write_tar(src / "b.tar", _sample("s2", encode(4), 1))

    summary = ingest(src, tmp_path / "out")

    assert [(r["key"], r["label"]) for r in shard_rows(tmp_path / "out")] == [
        ("a.tar:s0", 0), ("a.tar:s1", 1), ("b.tar:s2", 1)]
    reasons = _rejected(tmp_path / "out")
    assert list(reasons) == ["a.tar:big.jpg"] and summary["rejected"] == 1
    assert reasons["a.tar:big.jpg"] == (
        f"the tar member's header claims {big.size} bytes but the tar holds 100 after it (truncated or damaged tar); "
        "the rest of a.tar is rejected")
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["rows"] == 3


def test_a_garbage_header_mid_tar_is_recorded_not_silently_the_end(tmp_path, encode, shard_rows, write_tar):
    # tarfile ends its listing without a word at a header that does not parse: the members after it were lost.
    path = tmp_path / "x.tar"
    write_tar(path, _sample("s0", encode(0), 0) + _sample("s1", encode(1), 1))
    damaged = _offset_of(path, "s1.jpg")
    data = bytearray(path.read_bytes())
    data[damaged : damaged + 512] = b"\x07" * 512
    path.write_bytes(bytes(data))

    ingest(path, tmp_path / "out")

    assert [r["key"] for r in shard_rows(tmp_path / "out")] == ["x.tar:s0"]
    assert _rejected(tmp_path / "out") == {
        "x.tar": f"invalid tar header at byte {damaged}, after member 's0.cls'; the rest of x.tar is rejected"}


def _tar_with_a_huge_member(path: Path, image: bytes, huge: int) -> None:
    """A tar whose member ``huge.jpg`` holds ``huge`` zero bytes, written as a hole: the file takes no disk space."""
    with open(path, "wb") as f:
        for name, data, size in [("s0.jpg", image, len(image)), ("s0.cls", b"1", 1), ("huge.jpg", b"", huge),
                                 ("huge.cls", b"0", 1)]:
            info = tarfile.TarInfo(name)
            info.size = size
            f.write(info.tobuf(tarfile.USTAR_FORMAT))
            f.write(data)
            f.seek((size - len(data)) + (-size % tarfile.BLOCKSIZE), io.SEEK_CUR)
        f.write(tarfile.NUL * 2 * tarfile.BLOCKSIZE)


def _sparse_folder(root: Path, image: bytes, huge: int) -> None:
    (root / "a").mkdir(parents=True)
    (root / "a" / "s0.jpg").write_bytes(image)
    with open(root / "a" / "huge.jpg", "wb") as f:
        f.write(image)
        f.truncate(huge)  # a sparse file: stat says `huge` bytes, the disk holds one image


@pytest.mark.parametrize("kind", ["tar", "folder"])
def test_a_sample_over_max_sample_bytes_is_refused_from_its_size_before_it_is_read(tmp_path, encode, shard_rows,
                                                                                    kind):
    # Before: the member was read whole (a 2 GB sparse member cost 2.34 GB of RSS), then refused as not an image.
    huge, limit = 300 << 20, 1 << 20
    if kind == "tar":
        source, where = tmp_path / "x.tar", "x.tar:huge.jpg"
        _tar_with_a_huge_member(source, encode(0), huge)
    else:
        source, where = tmp_path / "folder", "a/huge.jpg"
        _sparse_folder(source, encode(0), huge)

    tracemalloc.start()
    try:
        ingest(source, tmp_path / "out", IngestOptions(max_sample_bytes=limit))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert peak < 32 << 20, f"{peak} bytes allocated at peak: the {huge}-byte sample was read"
    assert len(shard_rows(tmp_path / "out")) == 1
    assert _rejected(tmp_path / "out") == {
        where: f"{huge} bytes, over the {limit}-byte limit (--max-sample-bytes); not read"}


def test_max_sample_bytes_defaults_to_256_mib_and_is_a_cli_flag(tmp_path, encode, shard_rows):
    assert IngestOptions().max_sample_bytes == 256 << 20
    _tar_with_a_huge_member(tmp_path / "x.tar", encode(0), 5000)
    assert main(["ingest", str(tmp_path / "x.tar"), str(tmp_path / "out"), "--workers", "1",
                 "--max-sample-bytes", "4999"]) == 0
    assert _rejected(tmp_path / "out") == {
        "x.tar:huge.jpg": "5000 bytes, over the 4999-byte limit (--max-sample-bytes); not read"}
    with pytest.raises(ValueError, match="--max-sample-bytes must be positive, got 0"):
        IngestOptions(max_sample_bytes=0)


def test_a_tar_cut_inside_a_header_keeps_the_members_before_it(tmp_path, encode, shard_rows, write_tar):
    path = tmp_path / "x.tar"
    write_tar(path, _sample("s0", encode(0), 0) + _sample("s1", encode(1), 1))
    cut = _offset_of(path, "s1.jpg") + 100
    with open(path, "r+b") as f:
        f.truncate(cut)
    ingest(path, tmp_path / "out")
    assert [r["key"] for r in shard_rows(tmp_path / "out")] == ["x.tar:s0"]
    assert _rejected(tmp_path / "out") == {
        "x.tar": f"invalid tar header at byte {cut - 100}, after member 's0.cls'; the rest of x.tar is rejected"}


def test_a_parquet_cell_over_max_sample_bytes_is_refused(tmp_path, encode, shard_rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    small, large = encode(0), encode(1, (200, 200))
    pq.write_table(pa.table({"image": [small, large], "label": [0, 1]}), tmp_path / "x.parquet")
    ingest(tmp_path / "x.parquet", tmp_path / "out", IngestOptions(max_sample_bytes=len(small)))
    assert [r["key"] for r in shard_rows(tmp_path / "out")] == ["x.parquet:0"]
    assert _rejected(tmp_path / "out") == {
        "x.parquet:1": f"{len(large)} bytes, over the {len(small)}-byte limit (--max-sample-bytes); not read"}


def test_end_of_archive_zeros_cut_short_are_not_damage(tmp_path, encode, shard_rows, write_tar):
    path = tmp_path / "x.tar"
    write_tar(path, _sample("s0", encode(0), 0))
    with tarfile.open(path, "r:") as tar:
        last = tar.getmember("s0.cls")
    with open(path, "r+b") as f:
        f.truncate(last.offset_data + tarfile.BLOCKSIZE + 100)  # the data block, then 100 of the 1024 zero bytes
    ingest(path, tmp_path / "out")
    assert [r["key"] for r in shard_rows(tmp_path / "out")] == ["x.tar:s0"]
    assert _rejected(tmp_path / "out") == {}
