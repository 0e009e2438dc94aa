"""Subcommands of the ``stallfree`` command line; each module exposes ``register(subparsers)``."""

__all__ = ["CliError"]


class CliError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""
