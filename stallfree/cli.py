"""The ``stallfree`` command: one entry point, one subcommand per module in ``stallfree/commands``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a callable
taking the parsed namespace and returning the exit code. Errors a user can fix are :class:`CliError` (or a
``ValueError``/``FileNotFoundError``/``PermissionError`` from the library, a store that does not answer
(:class:`~stallfree.ingest.remote.RemoteStoreError`), or :class:`~stallfree.core.dali.DaliMissing`: no DALI installed)
and end as one readable line on stderr and exit code 2.

Building the parser imports no torch, DALI or Numba (each command imports them inside its function), so that
every ``--help`` answers at once and the ingest worker processes, forked from this one, start light.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Iterator, Sequence

from stallfree import __version__
from stallfree.commands import CliError
from stallfree.core.dali import DaliMissing
from stallfree.ingest.remote import RemoteStoreError

__all__ = ["CliError", "HelpFormatter", "main", "parsers"]

# Subcommand modules under stallfree.commands, in the order `stallfree --help` lists them.
COMMANDS = ("demo", "ingest", "train", "bench", "profile", "plan")


# reStructuredText that docstrings carry into help: ``literal``, :role:`~pkg.mod.name`, :role:`text <target>`.
_RST = (
    (re.compile(r":[a-z]+:`~?(?:[\w.]+\.)?([^`<]+?)(?: <[^`>]*>)?`"), r"\1"),
    (re.compile(r"``([^`]+)``"), r"\1"),
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` as a user reads it: each option's default where it has one, and RST markup as plain text.

    Descriptions and epilogs keep their line breaks (the examples). An option whose help already says its default
    (``(default: the cores this process may use)``), whose default is ``None``, or that is a flag, is left as written.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        flag = action.nargs == 0  # --resume, --no-progress: the flag's absence is the default
        if flag or not action.option_strings or action.default in (None, argparse.SUPPRESS) or "default" in text:
            return action.help
        if isinstance(action.default, (list, tuple)):  # nargs="+": shown as it is typed
            shown = " ".join(str(v) for v in action.default).replace("%", "%%")
            return f"{text} (default {shown})".lstrip()
        return f"{text} (default %(default)s)".lstrip()

    def format_help(self) -> str:
        text = super().format_help()
        for pattern, plain in _RST:
            text = pattern.sub(plain, text)
        return text


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it, depth first."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                yield from parsers(child)


def _import_user_models(args: argparse.Namespace) -> None:
    """Let ``--model package.module:factory`` import from the current directory, as ``python -m`` would.

    The ``stallfree`` script puts its own folder first on ``sys.path``, not the current one; spawned stage processes
    inherit the parent's ``sys.path``.
    """
    if ":" in str(getattr(args, "model", None) or "") and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="stallfree",
        description="Training input pipelines that never stall the step.",
        epilog="examples:\n  stallfree demo\n  stallfree bench loader ./data/train\n"
        "Run `stallfree COMMAND --help` for each command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"stallfree {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"stallfree.commands.{name}").register(sub)
    for each in parsers(parser):
        each.formatter_class = HelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    _import_user_models(args)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught below
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except (CliError, ValueError, FileNotFoundError, NotADirectoryError, PermissionError, RemoteStoreError,
            DaliMissing) as err:
        print(f"stallfree {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"stallfree {args.command}: interrupted", file=sys.stderr)
        return 130


def _stdout_closed() -> int:
    """The reader of stdout left (``stallfree info DIR --json | head``): end quietly, as a tool killed by SIGPIPE.

    Python's documented recipe (library/signal, "Note on SIGPIPE"): point stdout at devnull so that the flush at
    interpreter exit does not raise again.
    """
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a file descriptor (a caller's StringIO) has nothing to flush
        pass
    return 128 + 13  # 141: the status a shell reports for a process ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
