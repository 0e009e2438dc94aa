"""The docs show only public names: what a user copies from them keeps working when internals move."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = {"stallfree", "stallfree.transforms"}
IMPORT = re.compile(r"^\s*from (stallfree[\w.]*) import ([\w, ]+)", re.MULTILINE)
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])  # the guides and docs/records/


def _imports() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for module, names in IMPORT.findall(doc.read_text()):
            found.extend((doc.name, module, name.strip()) for name in names.split(",") if name.strip())
    return found


def test_the_docs_import_something() -> None:
    assert len(_imports()) >= 5  # the scan itself works: the docs do show imports


@pytest.mark.parametrize(("doc", "module", "name"), _imports())
def test_docs_import_only_public_names(doc: str, module: str, name: str) -> None:
    assert module in PUBLIC_MODULES, f"{doc} imports {name} from the internal module {module}"
    public = importlib.import_module(module)
    assert name in public.__all__, f"{doc} imports {name} from {module}, which does not export it"
    getattr(public, name)
