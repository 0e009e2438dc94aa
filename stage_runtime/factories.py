"""A user's ``package.module:factory`` on the command line (``--model``, ``--transform``): imported, checked callable.

A module is looked for in the current folder first, as ``python -m`` does (the ``stallfree`` script puts its own
folder first on ``sys.path``, not the current one): ``--transform myaug:fn`` finds ``./myaug.py``. The folder stays
on the path, so the stage processes spawned later (which inherit ``sys.path``) find it too.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["import_factory", "is_factory"]


def is_factory(text: str) -> bool:
    """Whether ``text`` names a factory (``package.module:factory``) rather than a value of the flag's own."""
    module, sep, attr = text.partition(":")
    return bool(sep) and module.replace(".", "").replace("_", "").isalnum() and attr.isidentifier()


def import_factory(text: str, flag: str) -> Callable[..., Any]:
    """The callable ``text`` (``package.module:factory``) names.

    Raises:
        ValueError: the module or the name cannot be imported, or is not callable; names ``flag``.
    """
    module_name, _, attr = text.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:  # "": python -m's and python -c's current folder
        sys.path.insert(0, os.getcwd())
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"{flag} {text!r}: cannot import {attr!r} from {module_name!r} ({err})") from err
    if not callable(factory):
        raise ValueError(f"{flag} {text!r}: {attr!r} is not callable")
    return factory
