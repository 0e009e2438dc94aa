"""Where stallfree keeps its files on this machine: ``$STALLFREE_CACHE_DIR``, else the XDG cache.

The verified-once markers (``stallfree.pipeline.verified``) and the staging folders of ingests to a URL
(:mod:`~stallfree.ingest.upload`) live under it; it is here, on the lowest floor, so that both find the same folder.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """The stallfree cache folder on this machine (``$STALLFREE_CACHE_DIR``, else the XDG cache)."""
    explicit = os.environ.get("STALLFREE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stallfree"
