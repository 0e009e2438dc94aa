"""docs/ingest.md's image-text example runs as written: its Python blocks, then its commands, in a fresh folder."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _example() -> list[tuple[str, str]]:
    """The blocks of the "Image-text samples" section after "An example that runs as it is": (language, code)."""
    text = (ROOT / "docs" / "ingest.md").read_text()
    section = re.search(r"^## Image-text samples\n(.*?)^## ", text, re.S | re.M)
    assert section is not None, "docs/ingest.md has no '## Image-text samples' section"
    example = section[1].split("An example that runs as it is", 1)
    assert len(example) == 2, "the section has no runnable example"
    return re.findall(r"^```(python|sh)\n(.*?)^```", example[1], re.S | re.M)


def test_the_image_text_example_runs(tmp_path: Path) -> None:
    blocks = _example()
    assert [language for language, _ in blocks] == ["python", "sh", "python"]
    script = Path(sys.executable).with_name("stallfree")  # the console script pip installed beside this Python
    assert script.is_file(), f"no {script}: install the package (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    outputs = []
    for language, code in blocks:
        if language == "python":
            commands = [[sys.executable, "-c", code]]
        else:
            commands = [shlex.split(line) for line in code.splitlines() if line.strip()]
            assert all(command[0] == "stallfree" for command in commands)
            commands = [[str(script), *command[1:]] for command in commands]
        for command in commands:
            done = subprocess.run(command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, f"{command[:3]} exited {done.returncode}: {done.stderr[-2000:]}"
            outputs.append(done.stdout + done.stderr)
    assert "30 caption pairs with 30 images" in outputs[1] and "0 rejected" in outputs[1]
    assert "30 conversations with 30 images" in outputs[2]
    assert "shards/chat: 30 conversations, 30 images" in outputs[3]
    assert "shards/chat: OK" in outputs[4]
    assert re.match(r"chat\.jsonl:0 \[\d+\] \[40, 48\] \d+ target tokens", outputs[5])
