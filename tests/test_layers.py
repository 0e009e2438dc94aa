"""The floors of DESIGN.md, held by import-linter: a lower floor never imports a higher one.

The subpackages live in top-level folders that ``stallfree/<sub>`` links to (``stallfree/ingest`` -> ``ingest/``),
so ``lint-imports`` runs from the repository root as the README's test command runs it, with the contract in
``pyproject.toml``. A back edge is planted in a copy of the package (the links followed), never in the tree.
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


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "lint-imports is not installed (pip install -e '.[test]')"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([lint, "--no-cache", str(REPO / "pyproject.toml")], cwd=root, env=env,
                          text=True, capture_output=True, timeout=120)


def test_every_subpackage_is_linked_into_the_package() -> None:
    for name in MAPPED:
        link = REPO / "stallfree" / name
        assert link.is_symlink() and link.resolve() == (REPO / name).resolve(), f"stallfree/{name} -> ../{name}"


def test_no_import_crosses_a_floor_upwards_run_from_the_root() -> None:
    result = _lint(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("floor", "target"), [
    ("transforms", "stallfree.pipeline.sampler"),
    ("pipeline", "stallfree.stage_runtime.clock"),
    ("ingest", "stallfree.transforms"),
    # inside stage_runtime: the planner and the trainer are independent (issue 45; plan imported train 12 times and
    # train plan 5), the profiler imports neither, and what they share imports none of them
    ("stage_runtime/plan", "stallfree.stage_runtime.train.trainer"),
    ("stage_runtime/train", "stallfree.stage_runtime.plan.books"),
    ("stage_runtime/profile", "stallfree.stage_runtime.train.rank"),
    ("stage_runtime/config", "stallfree.stage_runtime.train.optim"),
    ("stage_runtime/models", "stallfree.stage_runtime.plan.costs"),
])
def test_a_back_edge_breaks_the_contract(tmp_path: Path, floor: str, target: str) -> None:
    package = tmp_path / "stallfree"
    shutil.copytree(REPO / "stallfree", package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (package / floor / "_back_edge.py").write_text(f"import {target}  # noqa: F401\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    shown = " ".join(result.stdout.split())  # the report wraps long lines
    assert f"stallfree.{floor.replace('/', '.')}._back_edge -> {target}" in shown


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_inside_the_package() -> None:
    # Imports inside functions count: they hid spec -> resample -> numba_abi -> color -> spec. Imports made only
    # for type checking do not run, and are left out.
    import grimp

    imports = grimp.build_graph("stallfree", exclude_type_checking_imports=True)
    graph = {module: set(imports.find_modules_directly_imported_by(module)) for module in imports.modules}
    assert _cycles(graph) == []
