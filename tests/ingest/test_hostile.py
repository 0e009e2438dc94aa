"""Corrupt and hostile inputs land in rejected.jsonl with a reason, never in a shard, never crash the ingest."""

import io
import json
import os
import struct
import tarfile
import zlib

import pytest

from stallfree.ingest.runner import ingest
from stallfree.ingest.validate import Rejected, check_image
from stallfree.ingest.writer import IngestOptions


def png_claiming(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def rejected(out) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in map(json.loads, (out / "rejected.jsonl").read_text().splitlines())}


def test_bad_files_in_a_folder(tmp_path, encode, shard_rows):
    good = encode(0)
    (tmp_path / "src" / "a").mkdir(parents=True)
    files = {
        "good.jpg": good,
        "truncated.jpg": good[: len(good) // 2],
        "empty.jpg": b"",
        "text.jpg": b"just some text, not an image\n",
        "bomb.png": png_claiming(100_000, 100_000),
        "truncated.png": encode(1, fmt="PNG")[:-20],
    }
    for name, data in files.items():
        (tmp_path / "src" / "a" / name).write_bytes(data)
    (tmp_path / "outside.jpg").write_bytes(good)
    os.symlink(tmp_path / "outside.jpg", tmp_path / "src" / "a" / "link.jpg")
    os.symlink(tmp_path / "src" / "a", tmp_path / "src" / "a" / "loop")  # followed, it would never end
    summary = ingest(tmp_path / "src", tmp_path / "out")
    assert [r["key"] for r in shard_rows(tmp_path / "out")] == ["a/good.jpg"]
    reasons = rejected(tmp_path / "out")
    assert summary["rejected"] == len(reasons) == 7
    assert reasons["a/loop"] == "folder link loops (it leads to a folder that contains it)"
    assert "truncated" in reasons["a/truncated.jpg"].lower()
    assert reasons["a/empty.jpg"] == "empty file"
    assert "not an image" in reasons["a/text.jpg"]
    assert "100000x100000" in reasons["a/bomb.png"] or "decompression bomb" in reasons["a/bomb.png"]
    assert "truncated PNG" in reasons["a/truncated.png"]
    assert "escapes the source root through a link" in reasons["a/link.jpg"]


def test_max_pixels_and_validate(encode):
    data = encode(0, size=(30, 40))
    with pytest.raises(Rejected, match=r"claims 30x40 = 1200 pixels, more than max_pixels=1000"):
        check_image(data, max_pixels=1000)
    corrupt = bytearray(data)
    start = corrupt.find(b"\xff\xc4") + 5
    corrupt[start : start + 16] = b"\xff" * 16  # a bogus Huffman table: the header is fine, only a decode fails
    assert check_image(bytes(corrupt)).height == 30
    with pytest.raises(Rejected, match="decoding failed"):
        check_image(bytes(corrupt), validate=True)


def test_paths_escaping_a_list_root(tmp_path, encode, shard_rows):
    root = tmp_path / "data"
    root.mkdir()
    (root / "ok.jpg").write_bytes(encode(0))
    (tmp_path / "secret.jpg").write_bytes(encode(1))
    (root / "list.csv").write_text(
        f"path,label\nok.jpg,0\n../secret.jpg,1\n{tmp_path / 'secret.jpg'},1\nmissing.jpg,0\n"
    )
    summary = ingest(root / "list.csv", tmp_path / "out")
    assert [r["key"] for r in shard_rows(tmp_path / "out")] == ["ok.jpg"]
    reasons = rejected(tmp_path / "out")
    assert summary["rejected"] == 3
    assert "escapes the source root ('..')" in reasons["../secret.jpg"]
    assert "absolute path" in reasons[str(tmp_path / "secret.jpg")]
    assert reasons["missing.jpg"] == "missing file"


def test_hostile_tar_members(tmp_path, encode, shard_rows):
    def add(tar, name, data=b"", link=None):
        member = tarfile.TarInfo(name)
        if link:
            member.type, member.linkname = tarfile.SYMTYPE, link
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))

    with tarfile.open(tmp_path / "x.tar", "w") as tar:
        add(tar, "good.jpg", encode(0))
        add(tar, "good.cls", b"1")
        add(tar, "../evil.jpg", encode(1))
        add(tar, "/abs.jpg", encode(2))
        add(tar, "sneaky.jpg", link="/etc/passwd")
        add(tar, "sneaky.cls", b"0")
        add(tar, "nolabel.jpg", encode(3))
        add(tar, "badlabel.jpg", encode(4))
        add(tar, "badlabel.cls", b"cat")
    summary = ingest(tmp_path / "x.tar", tmp_path / "out")
    assert [(r["key"], r["label"]) for r in shard_rows(tmp_path / "out")] == [("x.tar:good", 1)]
    reasons = rejected(tmp_path / "out")
    assert "escapes the root" in reasons["x.tar:../evil.jpg"]
    assert "absolute path" in reasons["x.tar:/abs.jpg"]
    assert "link in tar" in reasons["x.tar:sneaky.jpg"]
    assert "lacks an image" in reasons["x.tar:nolabel"] and "lacks an image" in reasons["x.tar:sneaky"]
    assert "not a non-negative integer" in reasons["x.tar:badlabel"]
    assert summary["rejected"] == len(reasons) == 6


def test_compressed_tar_is_a_clear_error(tmp_path, encode):
    with tarfile.open(tmp_path / "x.tar", "w:gz") as tar:
        member = tarfile.TarInfo("a.jpg")
        member.size = 3
        tar.addfile(member, io.BytesIO(b"abc"))
    with pytest.raises(ValueError, match="needs uncompressed .tar"):
        ingest(tmp_path / "x.tar", tmp_path / "out", IngestOptions())
