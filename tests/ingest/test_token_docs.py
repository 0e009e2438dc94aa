"""docs/ingest.md's token example runs as written: its Python blocks, then its commands, in a fresh folder."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _example() -> list[tuple[str, str]]:
    """The blocks of the "Token sequences" section after "An example that runs as it is": (language, code)."""
    text = (ROOT / "docs" / "ingest.md").read_text()
    section = re.search(r"^## Token sequences\n(.*?)^## ", text, re.S | re.M)
    assert section is not None, "docs/ingest.md has no '## Token sequences' section"
    example = section[1].split("An example that runs as it is", 1)
    assert len(example) == 2, "the section has no runnable example"
    return re.findall(r"^```(python|sh)\n(.*?)^```", example[1], re.S | re.M)


def test_the_token_example_runs(tmp_path: Path) -> None:
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
    assert "1000 documents" in outputs[1] and "0 rejected" in outputs[1]
    assert "shards/text: OK" in outputs[3]
    assert outputs[4].startswith("1000 ")
