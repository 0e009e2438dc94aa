"""Subcommands of the ``stallfree`` command line; each module exposes ``register(subparsers)``."""

__all__: list[str] = []
