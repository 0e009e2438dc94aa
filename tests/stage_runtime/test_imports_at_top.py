"""First-party imports sit at the top of stage_runtime's modules and of its commands, where an import-graph reader
sees the layers (issue 45, item 5: 86 imports inside functions hid plan <-> train). One that stays inside a
function says why on its line or just above its block: start-up time (``stallfree --help`` imports no torch), an
optional extra (DALI), or a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted([*(ROOT / "stage_runtime").rglob("*.py"),
                  *(ROOT / "stallfree" / "commands" / name for name in ("train.py", "plan.py", "profile.py"))])


def _first_party(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "stallfree"
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "stallfree" for a in node.names)


def _unexplained(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    found = []
    for function in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not _first_party(node):
                continue
            top = node.lineno - 1  # the first line of the block of imports it is in
            while top > 0 and lines[top - 1].lstrip().startswith(("from ", "import ")):
                top -= 1
            block = lines[top:node.end_lineno or node.lineno]
            if not any("#" in line for line in block) and not lines[top - 1].lstrip().startswith("#"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_import_inside_a_function_says_why(path: Path) -> None:
    assert _unexplained(path) == []
