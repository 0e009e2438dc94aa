"""The `torchvision` marker's skip: tests against real torchvision objects run only where it is importable."""

from __future__ import annotations

import importlib.util

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("torchvision") is not None:
        return
    skip = pytest.mark.skip(reason="needs torchvision (pip install torch==2.14.1 torchvision==0.29.1)")
    for item in items:
        if "torchvision" in item.keywords:
            item.add_marker(skip)
