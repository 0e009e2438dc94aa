"""The Loader: sampler, readers, the DALI graph's assembly, hand-off to torch, prefetch."""

from stallfree.core.dali import require_dali

__all__: list[str] = []

require_dali()  # the Loader decodes in DALI: without it, one line naming the extra to install
