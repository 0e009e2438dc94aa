"""Without NVIDIA DALI (an extra: ``stallfree[cu12]`` or ``stallfree[cu13]``), what needs it says so in one line.

``import stallfree``, every ``--help`` and the commands that do not decode (ingest, verify, info) work as before;
the Loader, the transforms and ``stallfree demo`` raise ``DaliMissing`` (an ``ImportError``) naming both extras.
Each case runs in a fresh interpreter where importing ``nvidia.dali`` fails as it does when it is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stallfree.core.dali import MISSING_DALI, DaliMissing, require_dali

HIDE_DALI = "import sys; sys.modules['nvidia.dali'] = None  # 'import nvidia.dali' now raises ModuleNotFoundError\n"


def without_dali(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", HIDE_DALI + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=240)


def test_the_message_names_both_extras() -> None:
    assert "pip install 'stallfree[cu12]'" in MISSING_DALI and "'stallfree[cu13]'" in MISSING_DALI
    assert "\n" not in MISSING_DALI
    require_dali()  # here it is installed


@pytest.mark.parametrize("statement", ["from stallfree import Loader", "import stallfree.transforms",
                                       "from stallfree.pipeline.loader import Loader"])
def test_the_loader_and_transforms_fail_with_one_line(statement: str) -> None:
    done = without_dali(f"""
        import stallfree
        try:
            {statement}
        except ImportError as err:
            print(json.dumps([type(err).__name__, str(err)]))
    """.replace("import stallfree\n", "import json, stallfree\n"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [DaliMissing.__name__, MISSING_DALI]


@pytest.mark.slow
def test_help_ingest_and_info_work_and_demo_says_what_to_install(tmp_path: Path) -> None:
    from PIL import Image

    for name in ("a", "b"):
        (tmp_path / "src" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / "src" / name / "x.png")
    done = without_dali("""
        import json, sys
        from stallfree.cli import main
        codes = {}
        for argv in (["--help"], ["demo", "--help"], ["ingest", "--help"], ["train", "--help"]):
            try:
                main(argv)
            except SystemExit as end:
                codes[" ".join(argv)] = end.code
        codes["ingest"] = main(["ingest", sys.argv[1], sys.argv[2], "--workers", "1"])
        codes["info"] = main(["info", sys.argv[2]])
        codes["demo"] = main(["demo", "--out", sys.argv[3]])
        sys.stderr.write("\\n" + json.dumps(codes))
    """, str(tmp_path / "src"), str(tmp_path / "shards"), str(tmp_path / "demo"))
    codes = json.loads(done.stderr.strip().splitlines()[-1])
    assert codes == {"--help": 0, "demo --help": 0, "ingest --help": 0, "train --help": 0, "ingest": 0, "info": 0,
                     "demo": 2}, done.stderr
    assert f"stallfree demo: error: {MISSING_DALI}" in done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "demo").exists(), "demo wrote its data before finding that DALI is missing"
