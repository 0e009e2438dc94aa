"""NVIDIA DALI is an extra: ``stallfree[cu12]`` or ``stallfree[cu13]``, the build for the user's CUDA driver.

PyPI has one DALI wheel per CUDA major version, and both provide the same ``nvidia.dali`` package, so stallfree
cannot depend on one without breaking the other's users (``nvidia-dali-cuda130`` needs a CUDA 13 driver, >= 580,
for the GPU path). Without DALI, what decodes or augments (``stallfree.Loader``, ``stallfree.transforms``, the
``demo``, ``train``, ``bench`` and ``profile`` commands) stops at :func:`require_dali` with one line naming the
extra; ``import stallfree``, every ``--help``, ``ingest``, ``verify`` and ``info`` need no DALI.
"""

from __future__ import annotations

import importlib

__all__ = ["MISSING_DALI", "DaliMissing", "require_dali"]

MISSING_DALI = (
    "stallfree needs NVIDIA DALI, which is not installed: pip install 'stallfree[cu12]' (CUDA 12 drivers >= 525, "
    "and machines without a GPU) or 'stallfree[cu13]' (CUDA 13, driver >= 580)"
)


class DaliMissing(ImportError):
    """No ``nvidia.dali`` is importable; the message names the extra to install."""


def require_dali() -> None:
    """Import DALI, or raise :class:`DaliMissing` (a DALI that is present but fails to import raises its own error).

    Raises:
        DaliMissing: no ``nvidia.dali`` package is installed.
    """
    try:
        importlib.import_module("nvidia.dali")
    except ModuleNotFoundError as err:
        if err.name not in ("nvidia", "nvidia.dali"):
            raise  # DALI is there but something it needs is not: its own message says what
        raise DaliMissing(MISSING_DALI, name="nvidia.dali") from None
