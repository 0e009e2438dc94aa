"""--max-side, --raw, non-JPEG/PNG formats, and the command line (ingest, verify, info)."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from stallfree.cli import main
from stallfree.ingest.runner import ingest, parse_part
from stallfree.ingest.writer import IngestOptions


def test_max_side_re_encodes_only_large_images(tmp_path, encode, shard_rows):
    (tmp_path / "src" / "a").mkdir(parents=True)
    small, large = encode(0, size=(20, 30)), encode(1, size=(60, 90), fmt="PNG")
    (tmp_path / "src" / "a" / "small.jpg").write_bytes(small)
    (tmp_path / "src" / "a" / "large.png").write_bytes(large)
    ingest(tmp_path / "src", tmp_path / "out", IngestOptions(max_side=45, quality=80))
    rows = {r["key"]: r for r in shard_rows(tmp_path / "out")}
    assert rows["a/small.jpg"]["image"] == small
    image = Image.open(io.BytesIO(rows["a/large.png"]["image"]))
    assert image.format == "JPEG" and image.size == (45, 30)
    assert (rows["a/large.png"]["height"], rows["a/large.png"]["width"]) == (30, 45)


def test_raw_stores_resized_pixels(tmp_path, encode, shard_rows):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.jpg").write_bytes(encode(0, size=(40, 40)))
    ingest(tmp_path / "src", tmp_path / "out", IngestOptions(raw=(8, 12)))
    (row,) = shard_rows(tmp_path / "out")
    expected = np.asarray(Image.open(tmp_path / "src" / "a" / "x.jpg").convert("RGB").resize((12, 8),
                          Image.Resampling.BILINEAR, reducing_gap=None))
    assert np.array_equal(np.frombuffer(row["image"], np.uint8).reshape(8, 12, 3), expected)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["image"] == {"kind": "raw", "shape": [8, 12, 3]}


def test_other_formats_become_lossless_png(tmp_path, encode, shard_rows):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.bmp").write_bytes(encode(0, fmt="BMP"))
    ingest(tmp_path / "src", tmp_path / "out")
    (row,) = shard_rows(tmp_path / "out")
    assert row["image"][:4] == b"\x89PNG"
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(row["image"]))),
                          np.asarray(Image.open(tmp_path / "src" / "a" / "x.bmp")))


def test_bad_options_show_their_values():
    with pytest.raises(ValueError, match=r"--quality must be in 1..100, got 0"):
        IngestOptions(quality=0)
    with pytest.raises(ValueError, match=r"--raw and --max-side exclude each other"):
        IngestOptions(raw=(8, 8), max_side=10)
    with pytest.raises(ValueError, match=r"--part must be i/N with 0 <= i < N \(e.g. 0/4\), got '3/3'"):
        parse_part("3/3")


def test_command_line(folder, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ingest", str(folder), str(out), "--workers", "1", "--shard-size", "0.01", "--quiet",
                 "--json-file", str(tmp_path / "s.json")]) == 0
    assert "18 images in" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["images"] == 18
    assert main(["verify", str(out)]) == 0
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "18 rows" in text and "circle" in text
    assert main(["info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["classes"] == {"circle": 6, "square": 6, "triangle": 6}
    shard = sorted(out.glob("shard-*.arrow"))[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", str(out)]) == 1
    assert f"{shard.name}: SHA-256 differs" in capsys.readouterr().out
    shard.write_bytes(bytes(data[:-100]))
    assert main(["verify", str(out)]) == 1
    assert "(truncated?)" in capsys.readouterr().out
    assert main(["ingest", str(folder)]) == 2
    assert "ingest takes SRC and OUT" in capsys.readouterr().err


def test_bench_ingest_runs(folder, tmp_path, capsys):
    assert main(["bench", "ingest", str(folder), "--workers", "1", "--json-file", str(tmp_path / "b.json")]) == 0
    assert "images/s" in capsys.readouterr().out
    assert json.loads((tmp_path / "b.json").read_text())["ingest"][0]["images"] == 18
