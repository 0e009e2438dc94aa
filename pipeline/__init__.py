"""The Loader: sampler, readers, the DALI graph's assembly, hand-off to torch, prefetch."""

__all__: list[str] = []
