"""``stallfree ingest --layout``: image-text samples from the command line; ``info`` and ``verify`` on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main


@pytest.fixture
def captions(tmp_path: Path) -> Path:
    from stallfree.ingest.synthetic import make_image_folder

    make_image_folder(tmp_path / "img", num_classes=2, per_class=2, size=(12, 16))
    names = sorted(p.relative_to(tmp_path / "img").as_posix() for p in (tmp_path / "img").rglob("*.jpg"))
    rows = [{"picture": name, "caption": f"a {name.split('/')[0]}"} for name in names]
    rows.append({"picture": "missing.jpg", "caption": "gone"})
    path = tmp_path / "rows" / "caps.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_captions_are_ingested_summarised_shown_and_verified(captions, bpe_tokenizer, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["ingest", str(captions), str(out), "--tokenizer", str(bpe_tokenizer), "--layout", "caption",
                 "--image-field", "picture", "--text-field", "caption", "--image-root", str(tmp_path / "img"),
                 "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # JSON alone on stdout
    assert summary["documents"] == 4 and summary["images"] == 4 and summary["rejected"] == 1
    assert "4 caption pairs with 4 images" in captured.err
    assert f"1 rejected (see {out}/rejected.jsonl)" in captured.err
    assert main(["info", str(out)]) == 0
    info = capsys.readouterr().out
    assert "4 caption pairs, 4 images" in info
    assert "columns: tokens, length, images, image_at, image_sizes, assistant, source" in info
    assert main(["verify", str(out), "--decode"]) == 0
    assert f"{out}: OK" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--layout", "caption"], "--layout caption tokenizes text at ingest: pass --tokenizer PATH"),
    (["--image-root", "."], "--image-root applies to image-text samples: pass --layout caption or --layout "
                            "conversations too"),
    (["--layout", "caption", "--tokenizer", "t.json", "--raw", "8x8", "--workers", "2"],
     "--raw, --workers do not apply to an image-text ingest"),
    (["--layout", "conversations", "--tokenizer", "t.json", "--text-field", "caption"],
     "--text-field does not apply to --layout conversations; drop it"),
])
def test_a_wrong_flag_is_one_line_and_exit_2(flags, message, captions, tmp_path, capsys):
    assert main(["ingest", str(captions), str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_every_row_rejected_is_exit_1(captions, bpe_tokenizer, tmp_path, capsys):
    assert main(["ingest", str(captions), str(tmp_path / "out"), "--tokenizer", str(bpe_tokenizer), "--layout",
                 "caption"]) == 1  # no row has an 'image' field
    assert "nothing was ingested: all 5 rows were rejected" in capsys.readouterr().err


def test_rows_with_images_and_no_flag_point_at_layout(tmp_path, capsys):
    (tmp_path / "chat.jsonl").write_text(json.dumps({"image": "a.png", "conversations": []}) + "\n")
    assert main(["ingest", str(tmp_path / "chat.jsonl"), str(tmp_path / "out")]) == 2
    assert "add --layout caption or --layout conversations" in capsys.readouterr().err
