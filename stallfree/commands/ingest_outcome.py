"""What every ``stallfree ingest`` (images, tokens, image-text samples) does with its run's outcome, in one place.

A full disk is not a usage error (exit 1, not 2: the same command succeeds once there is room); a missing optional
package (``tokenizers``, ``transformers``) is one line saying what to install; an ingest that rejected every row
exits 1 naming the file that lists why.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from stallfree.commands import CliError

__all__ = ["nothing_ingested", "run_ingest"]


def run_ingest(call: Callable[[], dict[str, Any]]) -> dict[str, Any] | int:
    """``call()``'s summary; or, when the disk filled, the line printed and exit code 1.

    Raises:
        CliError: an optional package the ingest needs is not installed (its message says which to install).
    """
    # lazy: `stallfree --help` imports no NumPy (tests/cli/test_imports.py)
    from stallfree.ingest.runner import DiskFull

    try:
        return call()
    except ImportError as err:
        raise CliError(str(err)) from None
    except DiskFull as err:
        print(f"stallfree ingest: error: {err}", file=sys.stderr)
        return 1


def nothing_ingested(written: int, rejected: int, record: str, rows: str = "samples") -> int:
    """Exit code 1 and one line when every row was rejected (``written`` 0): a dataset of nothing is not a success."""
    if written or not rejected:
        return 0
    print(f"stallfree ingest: error: nothing was ingested: all {rejected} {rows} were rejected; the reasons are in "
          f"{record}", file=sys.stderr)
    return 1
