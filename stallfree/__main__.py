"""``python -m stallfree``: the same command line as ``stallfree``."""

from __future__ import annotations

import sys

from stallfree.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
