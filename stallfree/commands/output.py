"""How every command reports its result: one rule for ``--json`` and ``--json-file``.

- without flags: the human text on stdout, progress on stderr;
- ``--json``: the result as JSON alone on stdout (so ``| jq`` works), the human text and progress on stderr;
- ``--json-file PATH``: the result also written to PATH (atomically), whichever of the above prints;
- ``--no-progress``: no progress bars or progress lines on stderr, on every command (``--quiet`` too, where
  ``ingest`` and ``verify`` named it so before);
- a folder a command writes (``--out``, ``ingest``'s OUT) is checked before any work by :func:`require_writable`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

from stallfree.commands import CliError

__all__ = ["add_json_arguments", "add_progress_argument", "emit", "human", "require_writable"]


def add_json_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--json`` and ``--json-file PATH`` to a command's parser."""
    parser.add_argument("--json", action="store_true",
                        help="print the result as JSON alone on stdout (the text and progress go to stderr)")
    parser.add_argument("--json-file", type=Path, metavar="PATH", help="also write the result as JSON to PATH")


def add_progress_argument(parser: argparse.ArgumentParser, *, quiet: bool = False) -> None:
    """Add ``--no-progress`` (``args.progress``, true by default); ``quiet`` keeps ``--quiet`` as its alias."""
    names = ["--no-progress", "--quiet"] if quiet else ["--no-progress"]
    parser.add_argument(*names, dest="progress", action="store_false",
                        help="no progress bars or progress lines on stderr (the result still prints)")


def human(args: argparse.Namespace) -> TextIO:
    """Where the human text goes: stdout, or stderr when stdout carries the JSON."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def emit(args: argparse.Namespace, result: Any) -> None:
    """Print ``result`` as JSON with ``--json`` and write it to ``--json-file``'s path when given."""
    text = json.dumps(result, indent=1, default=str) + "\n"
    path = getattr(args, "json_file", None)
    if path is not None:
        from stallfree.core.atomic import atomic_write

        atomic_write(Path(path), text.encode())
    if getattr(args, "json", False):
        sys.stdout.write(text)


def require_writable(folder: str | Path, flag: str) -> None:
    """Refuse, before any work, an output ``folder`` this process cannot write, naming the ``flag`` that moves it.

    A file is made and removed in ``folder``, or in its nearest existing parent when it does not exist yet: what
    decides is whether a write succeeds, not the permission bits (``os.access`` says yes to root in a folder of mode
    0555, where root may write, and cannot know of an NFS server that maps root to nobody).

    Raises:
        CliError: the folder (or the parent it would be made in) cannot be written, with the system's reason.
    """
    target = Path(folder).absolute()
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        where = "" if existing == target else f" (it would be made in {existing})"
        raise CliError(f"cannot write the output folder {target}{where}: {err.strerror or err}; give {flag} a "
                       "folder you can write") from None
