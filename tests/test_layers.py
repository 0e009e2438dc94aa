"""The floors of DESIGN.md, held by import-linter: a lower floor never imports a higher one.

The subpackages live in top-level folders that ``pyproject.toml`` maps into ``stallfree`` (``stallfree.ingest``
is ``ingest/``); import-linter finds a package's modules by walking its folder, so the test lays the package out
as it is installed (a copy under one ``stallfree/`` folder) and runs ``lint-imports`` on it with the contract in
``pyproject.toml``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAPPED = ["ingest", "transforms", "pipeline", "stage_runtime", "bench"]


def _installed_layout(root: Path) -> Path:
    package = root / "stallfree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "stallfree", package, ignore=ignore)
    for name in MAPPED:
        shutil.copytree(REPO / name, package / name, ignore=ignore)
    return package


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "lint-imports is not installed (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([lint, "--no-cache", str(REPO / "pyproject.toml")], cwd=root, env=env, text=True,
                          capture_output=True, timeout=120)


def test_no_import_crosses_a_floor_upwards(tmp_path: Path) -> None:
    _installed_layout(tmp_path)
    result = _lint(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("floor", "target"), [("transforms", "stallfree.pipeline.sampler"),
                                               ("pipeline", "stallfree.stage_runtime.clock"),
                                               ("ingest", "stallfree.transforms")])
def test_a_back_edge_breaks_the_contract(tmp_path: Path, floor: str, target: str) -> None:
    package = _installed_layout(tmp_path)
    (package / floor / "_back_edge.py").write_text(f"import {target}  # noqa: F401\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert f"stallfree.{floor}._back_edge -> {target}" in result.stdout
