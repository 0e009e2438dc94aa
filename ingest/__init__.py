"""Turning datasets into memory-mapped Arrow shards; validation; the synthetic demo dataset."""

__all__: list[str] = []
